// AVX2/FMA/F16C QLinear micro-kernels (the contract and the packed layout are in qlinear.h).
//
// group_dot: per sub-block of 32 elements, the 8 rows' codes come as 4 (int4) or 8 (int8) loads of
// 32 bytes, each 32-bit lane one row. A word of 4 activation codes is broadcast to all lanes and
// _mm256_maddubs_epi16 (unsigned codes x signed activations) gives 8 rows' partial dots at once.
// int4: the 8 maddubs of a sub-block are summed in int16 (each lane at most 16 * 15 * 127 = 30480,
// no overflow) and widened once by _mm256_madd_epi16; int8 uses |w| x sign(x, w) and widens each.
// Up to kQTile tokens share one unpacking of the weights (prefill); per block, one
// fma(d * dx, isum', acc) and one fma(m, sx, acc) per token: no horizontal reductions, and each
// output's float operations are the same whatever the number of tokens in the call.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "qlinear.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "avx2_math.h"

namespace ortllm {
namespace avx2 {
namespace {

#include "qlinear_group_dot.h"

// Rounds to nearest even like std::nearbyint in the default mode.
void quantize_row(const float* x, int K, int bs, int8_t* q, float* dx, int32_t* qsum) {
  const int kb = (K + bs - 1) / bs;
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int b = 0; b < kb; ++b) {
    const int k0 = b * bs, k1 = K < k0 + bs ? K : k0 + bs;
    __m256 vmax = _mm256_setzero_ps();
    int k = k0;
    for (; k + 8 <= k1; k += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float amax = 0.f;
    for (float v : lanes) amax = amax > v ? amax : v;
    for (; k < k1; ++k) amax = amax > std::fabs(x[k]) ? amax : std::fabs(x[k]);
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i vsum = _mm256_setzero_si256();
    int32_t s = 0;
    for (k = k0; k + 8 <= k1; k += 8) {
      const __m256i v = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      vsum = _mm256_add_epi32(vsum, v);
      alignas(32) int32_t c[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(c), v);
      for (int i = 0; i < 8; ++i) q[k + i] = static_cast<int8_t>(c[i]);
    }
    for (; k < k0 + bs; ++k) {
      const int v = k < k1 ? static_cast<int>(std::nearbyint(x[k] * id)) : 0;
      q[k] = static_cast<int8_t>(v);
      s += v;
    }
    alignas(32) int32_t sums[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums), vsum);
    for (int32_t v : sums) s += v;
    dx[b] = d;
    qsum[b] = s;
  }
}

// Integer dots by _mm256_maddubs_epi16: int4 sums a sub-block's 8 products per row pair in int16 (each lane
// at most 16 * 15 * 127 = 30480, no overflow) and widens once by _mm256_madd_epi16; int8 uses
// |w| x sign(x, w) and widens each product pair (2 * 128 * 127 would overflow an int16 sum).
struct Dots {
  template <int NT>
  static void sub4(const uint8_t* sub, const int8_t* const* qs, __m256i* isum) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i v[8];
    unpack4(sub, v);
    for (int t = 0; t < NT; ++t) {
      const int8_t* x = qs[t];
      __m256i p = _mm256_maddubs_epi16(v[0], bcast_word(x));
      for (int j = 1; j < 8; ++j) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(v[j], bcast_word(x + 4 * j)));
      isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ones));
    }
  }

  template <int NT>
  static void sub8(const uint8_t* sub, const int8_t* const* qs, __m256i* isum) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 8; ++i) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 32 * i));
      const __m256i aw = _mm256_abs_epi8(w);
      for (int t = 0; t < NT; ++t) {
        const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast_word(qs[t] + 4 * i), w));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ones));
      }
    }
  }

  template <int NT, int BITS>
  static const uint8_t* block(const uint8_t* codes, int sub_blocks, const int8_t* const* qs, const int32_t* zs,
                              __m256i* isum) {
    const int8_t* q[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_set1_epi32(-zs[t]), q[t] = qs[t];
    for (int s = 0; s < sub_blocks; ++s, codes += 32 * BITS) {
      if (BITS == 4) {
        sub4<NT>(codes, q, isum);
      } else {
        sub8<NT>(codes, q, isum);
      }
      for (int t = 0; t < NT; ++t) q[t] += 32;
    }
    return codes;
  }
};

void group_dot(const QGroup& g, const QTokens& x, int nt, float* out) {
  group_dot_any<Dots>(g, x, nt, out);
}

template <int NT>
void shrink_t(const float* const* x, int K, const uint16_t* A, int lda, int rank, float* const* h) {
  int r = 0;
  for (; r + 16 <= rank; r += 16) {  // 2 x NT accumulators: each pair of A loads feeds 2 * NT FMAs
    __m256 a0[NT], a1[NT];
    for (int t = 0; t < NT; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
    for (int k = 0; k < K; ++k) {
      const uint16_t* row = A + static_cast<int64_t>(k) * lda + r;
      const __m256 w0 = load_f16x8(row), w1 = load_f16x8(row + 8);
      for (int t = 0; t < NT; ++t) {
        const __m256 xv = _mm256_set1_ps(x[t][k]);
        a0[t] = _mm256_fmadd_ps(xv, w0, a0[t]);
        a1[t] = _mm256_fmadd_ps(xv, w1, a1[t]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      _mm256_storeu_ps(h[t] + r, a0[t]);
      _mm256_storeu_ps(h[t] + r + 8, a1[t]);
    }
  }
  for (; r + 8 <= rank; r += 8) {
    __m256 a0[NT];
    for (int t = 0; t < NT; ++t) a0[t] = _mm256_setzero_ps();
    for (int k = 0; k < K; ++k) {
      const __m256 w0 = load_f16x8(A + static_cast<int64_t>(k) * lda + r);
      for (int t = 0; t < NT; ++t) a0[t] = _mm256_fmadd_ps(_mm256_set1_ps(x[t][k]), w0, a0[t]);
    }
    for (int t = 0; t < NT; ++t) _mm256_storeu_ps(h[t] + r, a0[t]);
  }
  for (; r < rank; ++r) {
    for (int t = 0; t < NT; ++t) {
      float acc = 0.f;
      for (int k = 0; k < K; ++k) acc = std::fma(x[t][k], _cvtsh_ss(A[static_cast<int64_t>(k) * lda + r]), acc);
      h[t][r] = acc;
    }
  }
}

void lora_shrink(const float* const* x, int n, int K, const uint16_t* A, int lda, int rank, float* const* h) {
  switch (n) {
    case 4:
      shrink_t<4>(x, K, A, lda, rank, h);
      break;
    case 3:
      shrink_t<3>(x, K, A, lda, rank, h);
      break;
    case 2:
      shrink_t<2>(x, K, A, lda, rank, h);
      break;
    default:
      shrink_t<1>(x, K, A, lda, rank, h);
      break;
  }
}

template <int NT>
void expand_t(const float* const* h, int rank, const uint16_t* B, int64_t ldb, float scale, float* const* out) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int r = 0; r < rank; ++r) {
    const __m256 b = load_f16x8(B + r * ldb);
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(h[t][r]), b, acc[t]);
  }
  const __m256 s = _mm256_set1_ps(scale);
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out[t], _mm256_fmadd_ps(s, acc[t], _mm256_loadu_ps(out[t])));
}

void lora_expand8(const float* const* h, int n, int rank, const uint16_t* B, int64_t ldb, float scale,
                  float* const* out) {
  switch (n) {
    case 4:
      expand_t<4>(h, rank, B, ldb, scale, out);
      break;
    case 3:
      expand_t<3>(h, rank, B, ldb, scale, out);
      break;
    case 2:
      expand_t<2>(h, rank, B, ldb, scale, out);
      break;
    default:
      expand_t<1>(h, rank, B, ldb, scale, out);
      break;
  }
}

void silu_mul8(const float* g, const float* u, float* out) {
  const __m256 gv = _mm256_loadu_ps(g), one = _mm256_set1_ps(1.f);
  const __m256 e = exp256(_mm256_or_ps(gv, _mm256_set1_ps(-0.f)));  // exp(-|g|)
  const __m256 pos = _mm256_div_ps(one, _mm256_add_ps(one, e));
  const __m256 neg = _mm256_div_ps(e, _mm256_add_ps(one, e));
  const __m256 sig = _mm256_blendv_ps(neg, pos, _mm256_cmp_ps(gv, _mm256_setzero_ps(), _CMP_GE_OQ));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u)));
}

}  // namespace
}  // namespace avx2
}  // namespace ortllm

#pragma GCC pop_options

namespace ortllm {
// Compiled for the baseline ISA: only hands out the table.
const QLinearIsa* qlinear_avx2_isa() {
  static const QLinearIsa isa{
      "avx2", avx2::quantize_row, avx2::group_dot, nullptr, avx2::lora_shrink, avx2::lora_expand8, avx2::silu_mul8};
  return &isa;
}
}  // namespace ortllm
#else
namespace ortllm {
const QLinearIsa* qlinear_avx2_isa() {
  return nullptr;
}
}  // namespace ortllm
#endif
