// Memory side of QLinear's LoRA stacks: the reads of SmolLM2's q|k|v call (30 layers, rank 16, widths 576, 192, 192)
// for N slots a step, each slot's twelve blocks (A, A_scale, B, B_scale per segment) either in twelve stacks
// [layers, slots, block] (as the engine binds them) or as one run per (layer, slot) (the layout tried and reverted),
// with 2 MB of other reads between layers as the projections' weights stream (docs/adapters.md, Overhead). Reads
// only, no arithmetic.
//   g++ -O2 -mavx2 bench/probes/lora_runs_membench.cc -o /tmp/lrm && /tmp/lrm 4 && /tmp/lrm 16
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
__m256i sink;
void read(const int8_t* p, size_t n) {
  __m256i a = sink;
  for (size_t i = 0; i + 32 <= n; i += 32) a = _mm256_add_epi8(a, _mm256_loadu_si256((const __m256i*)(p + i)));
  sink = a;
}
int8_t* filled(size_t n) {
  auto* p = static_cast<int8_t*>(aligned_alloc(64, (n + 63) / 64 * 64));
  memset(p, 1, n);
  return p;
}
}  // namespace

int main(int argc, char** argv) {
  const int L = 30, S = 16, K = 576, r = 16, kc = (K + 31) / 32, W[3] = {576, 192, 192};
  const int slots = argc > 1 ? atoi(argv[1]) : 4, reps = 200;
  size_t block[12], run = 0;  // per segment: A [K * r], A_scale [kc * r] fp16, B [r * W], B_scale [W] fp16
  for (int j = 0; j < 3; ++j) {
    block[4 * j] = size_t(K) * r, block[4 * j + 1] = size_t(kc) * r * 2;
    block[4 * j + 2] = size_t(r) * W[j], block[4 * j + 3] = size_t(W[j]) * 2;
  }
  for (size_t b : block) run += (b + 63) / 64 * 64;
  int8_t* stacks[12];
  for (int i = 0; i < 12; ++i) stacks[i] = filled(size_t(L) * S * block[i]);
  int8_t* runs = filled(size_t(L) * S * run);
  const size_t other = size_t(2) << 20;
  int8_t* weights = filled(L * other);
  double t[2] = {0, 0};
  for (int rep = 0; rep < reps; ++rep) {
    for (int form = 0; form < 2; ++form) {  // alternating: 0 twelve stacks, 1 one run per slot
      for (int l = 0; l < L; ++l) {
        read(weights + l * other, other);
        const auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < slots; ++s) {
          const size_t at = size_t(l) * S + (s * 5 + rep) % S;  // slots change from step to step
          if (form == 0)
            for (int i = 0; i < 12; ++i) read(stacks[i] + at * block[i], block[i]);
          else
            read(runs + at * run, run);
        }
        t[form] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
  }
  printf("%d slots: twelve stacks %.3f ms a step, one run per slot (%zu bytes) %.3f ms a step\n", slots,
         t[0] / reps * 1e3, run, t[1] / reps * 1e3);
  int8_t out[32];
  _mm256_storeu_si256((__m256i*)out, sink);
  return out[0] == 99;
}
