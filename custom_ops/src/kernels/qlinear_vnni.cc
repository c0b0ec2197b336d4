// AVX-512 VNNI QLinear group micro-kernel (256-bit vectors: AVX512VL + AVX512_VNNI), picked at run time
// where the CPU has it (AMD Zen 4, Intel Ice Lake and later); everything else in the ISA table is AVX2's.
//
// _mm256_dpbusd_epi32 multiplies 4 unsigned codes by 4 signed activation bytes and adds the 4 products
// into a 32-bit lane in one instruction, where AVX2 needs maddubs + add (+ madd to widen). The sums are
// exact integers either way, so this path gives the same isum, hence the same bits, as AVX2 and scalar.
// A block's products are spread over several accumulators per token (independent dependency chains:
// one token alone would otherwise wait on dpbusd's latency 8 times per sub-block) and added at the end.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "qlinear.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

namespace ortllm {
namespace vnni {
namespace {

#include "qlinear_group_dot.h"

struct Dots {
  template <int NT, int BITS>
  static const uint8_t* block(const uint8_t* codes, int sub_blocks, const int8_t* const* qs, const int32_t* zs,
                              __m256i* isum) {
    constexpr int kChains = NT == 1 ? 4 : 2;  // accumulators per token (rotated per 4-byte word): >= 8 in all
    __m256i a[NT][kChains];
    for (int t = 0; t < NT; ++t) {
      a[t][0] = _mm256_set1_epi32(-zs[t]);
      for (int c = 1; c < kChains; ++c) a[t][c] = _mm256_setzero_si256();
    }
    for (int s = 0; s < sub_blocks; ++s, codes += 32 * BITS) {
      if (BITS == 4) {
        __m256i v[8];
        unpack4(codes, v);
        for (int t = 0; t < NT; ++t)
          for (int j = 0; j < 8; ++j)
            a[t][j % kChains] = _mm256_dpbusd_epi32(a[t][j % kChains], v[j], bcast_word(qs[t] + 32 * s + 4 * j));
      } else {  // int8: |w| x sign(x, w), as AVX2 (dpbusd's first operand is unsigned)
        for (int j = 0; j < 8; ++j) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * j));
          const __m256i aw = _mm256_abs_epi8(w);
          for (int t = 0; t < NT; ++t)
            a[t][j % kChains] =
                _mm256_dpbusd_epi32(a[t][j % kChains], aw, _mm256_sign_epi8(bcast_word(qs[t] + 32 * s + 4 * j), w));
        }
      }
    }
    for (int t = 0; t < NT; ++t) {  // exact integer sums: any order gives the same isum
      isum[t] = a[t][0];
      for (int c = 1; c < kChains; ++c) isum[t] = _mm256_add_epi32(isum[t], a[t][c]);
    }
    return codes;
  }
};

void group_dot(const QGroup& g, const QTokens& x, int nt, float* out) {
  group_dot_any<Dots>(g, x, nt, out);
}

}  // namespace
}  // namespace vnni
}  // namespace ortllm

#pragma GCC pop_options

namespace ortllm {
// Compiled for the baseline ISA: checks the CPU and hands out the table (AVX2's, with this group_dot).
const QLinearIsa* qlinear_vnni_isa() {
  static const QLinearIsa* isa = []() -> const QLinearIsa* {
    const QLinearIsa* avx2 = qlinear_avx2_isa();
    __builtin_cpu_init();
    if (avx2 == nullptr || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vl") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vnni"))
      return nullptr;
    static const QLinearIsa table{"avx512vnni",      avx2->quantize_row, vnni::group_dot,
                                  avx2->lora_shrink, avx2->lora_expand8, avx2->silu_mul8};
    return &table;
  }();
  return isa;
}
}  // namespace ortllm
#else
namespace ortllm {
const QLinearIsa* qlinear_vnni_isa() {
  return nullptr;
}
}  // namespace ortllm
#endif
