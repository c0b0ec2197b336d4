// This core's AVX-512 VNNI int8 rate, alone and with QLinear's float step beside it: the ceiling of the int8
// contract (an exact int32 sum a 32-element block, then cvt, mul, fma, fma on each 16-row vector, qlinear.h) on this
// path, against which the panel GEMM (custom_ops/src/kernels/x86/qlinear_vnni.cc, panel_sweep) is measured
// (bench/probes/qlinear_peak.py; docs/notes/benchmarks.md, "QLinear's VNNI panel GEMM"). Everything in registers:
//   dpbusd  24 independent zmm vpdpbusd chains (64 multiply-adds each)
//   block   QLinear's block at NT = 8 tokens: 8 k-quads x 8 tokens of dpbusd, then per token cvt, mul, fma, fma
//   g++ -O2 -mavx512f -mavx512vl -mavx512bw -mavx512vnni -mfma bench/probes/vnni_peak.cc -o /tmp/vnni_peak
//   /tmp/vnni_peak
#include <immintrin.h>

#include <chrono>
#include <cstdio>

namespace {

constexpr long kRounds = 100000000;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// G multiply-adds/s of 24 dpbusd chains (zmm0-23, operands zmm30-31: written in asm, so no compiler spills them).
__attribute__((noinline)) double dpbusd_only() {
  const auto t0 = std::chrono::steady_clock::now();
  for (long r = 0; r < kRounds; ++r)
    asm volatile(
        "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm1\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm2\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm3\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm4\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm5\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm6\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm7\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm8\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm9\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm10\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm11\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm12\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm13\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm14\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm15\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm16\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm17\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm18\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm19\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm20\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm21\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm22\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm23\n\t"
        :
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
  return 24.0 * 64 * kRounds / seconds_since(t0) / 1e9;
}

// G multiply-adds/s of QLinear's block for 8 tokens: 8 k-quads of dpbusd a token (one chain each), then the float
// step acc = fma(d * dx, float(isum), acc); acc = fma(m, sx, acc).
__attribute__((noinline)) double with_float_step(float* sink) {
  __m512 acc[8];
  for (auto& v : acc) v = _mm512_setzero_ps();
  __m512i w[8];
  for (int j = 0; j < 8; ++j) w[j] = _mm512_set1_epi8(static_cast<char>(j + 1));
  __m512i x = _mm512_set1_epi8(5);
  __m512 d = _mm512_set1_ps(0.01f), m = _mm512_set1_ps(0.001f);
  const float dx[8] = {1e-3f, 2e-3f, 3e-3f, 4e-3f, 5e-3f, 6e-3f, 7e-3f, 8e-3f};
  const auto t0 = std::chrono::steady_clock::now();
  for (long r = 0; r < kRounds / 4; ++r) {
    __m512i isum[8];
    for (int t = 0; t < 8; ++t) isum[t] = _mm512_set1_epi32(-t);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) isum[t] = _mm512_dpbusd_epi32(isum[t], w[j], x);
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[t])), _mm512_cvtepi32_ps(isum[t]), acc[t]);
      acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(dx[7 - t]), acc[t]);
    }
    asm volatile("" : "+v"(x), "+v"(d), "+v"(m));
  }
  const double s = seconds_since(t0);
  for (auto& v : acc) *sink += _mm512_reduce_add_ps(v);
  return 64.0 * 64 * (kRounds / 4) / s / 1e9;
}

}  // namespace

int main() {
  float fsink = 0;
  for (int rep = 0; rep < 3; ++rep)
    std::printf("dpbusd alone %.0f G MAC/s; with the float step a block (8 tokens) %.0f G MAC/s\n",
                dpbusd_only(), with_float_step(&fsink));
  return fsink == 42.f ? 1 : 0;
}
