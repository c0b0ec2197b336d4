// AVX2/FMA/F16C QLinear micro-kernels (the contract and the packed layout are in qlinear.h).
//
// group_dot: per sub-block of 32 elements, the 8 rows' codes come as 4 (int4) or 8 (int8) loads of
// 32 bytes, each 32-bit lane one row. A word of 4 activation codes is broadcast to all lanes and
// _mm256_maddubs_epi16 (unsigned codes x signed activations) gives 8 rows' partial dots at once.
// int4: the 8 maddubs of a sub-block are summed in int16 (each lane at most 16 * 15 * 127 = 30480,
// no overflow) and widened once by _mm256_madd_epi16; int8 uses |w| x sign(x, w) and widens each.
// Up to kQTile tokens share one unpacking of the weights (prefill); per block, one
// fma(d * dx, isum', acc) and one fma(m, sx, acc) per token: no horizontal reductions, and each
// output's float operations are the same whatever the number of tokens in the call. group_dot2 does
// two int4 groups at once (several tokens a call: decode batches, prefill), each broadcast of x
// serving 16 rows.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../qlinear.h"
#include "../stream_prefetch.h"
#include "isa_x86.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "avx2_math.h"

namespace ortllm {
namespace avx2 {
namespace {

#include "qlinear_group_dot.h"

// The largest lane of v.
float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// The sum of v's lanes.
int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

// max_i |x[i]|, i < n (exact: the same value in any order).
float absmax(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 vmax = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= n; k += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
  float amax = hmax(vmax);
  for (; k < n; ++k) amax = amax > std::fabs(x[k]) ? amax : std::fabs(x[k]);
  return amax;
}

// 8 floats times id, rounded half to even (as std::nearbyint in the default mode), as int32 lanes.
inline __m256i round8(const float* x, __m256 id) {
  return _mm256_cvtps_epi32(
      _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// One vector step of a full block: 32 int8 codes or 16 int16 codes at q (|x * id| <= kMax: no saturation happens);
// returns their int32 lanes' sum vector. packs works per 128-bit lane, so a permute puts the codes in order.
inline __m256i store_codes(const float* x, __m256 id, int8_t* q) {
  __m256i v[4];
  for (int i = 0; i < 4; ++i) v[i] = round8(x + 8 * i, id);
  // bytes come out as dwords [v0 lo, v1 lo, v2 lo, v3 lo | v0 hi, ...]
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
}
inline __m256i store_codes(const float* x, __m256 id, int16_t* q) {
  const __m256i v0 = round8(x, id), v1 = round8(x + 8, id);
  // [v0 lo, v1 lo | v0 hi, v1 hi] -> qwords (0, 2, 1, 3)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permute4x64_epi64(_mm256_packs_epi32(v0, v1), 0xD8));
  return _mm256_add_epi32(v0, v1);
}

// quantize_row (int8 codes, kMax 127) and quantize_row16 (int16 codes, act_bits 16, kMax 32767): dx = absmax / kMax,
// rounded half to even like std::nearbyint. Full blocks (bs a multiple of 32) in vectors: the absmax, then
// store_codes' steps; a block cut by K (the last one) element by element, zero-padded. The same codes, scales and
// sums either way, and as the scalar path's.
template <class Code, int kMax>
void quantize_codes(const float* x, int K, int bs, Code* q, float* dx, int32_t* qsum) {
  constexpr int kStep = 32 / static_cast<int>(sizeof(Code));  // codes a store_codes step writes
  const int kb = (K + bs - 1) / bs;
  for (int b = 0; b < kb; ++b) {
    const int k0 = b * bs, k1 = K < k0 + bs ? K : k0 + bs;
    const float d = absmax(x + k0, k1 - k0) / static_cast<float>(kMax);
    const float id = d != 0.f ? 1.f / d : 0.f;
    int32_t s = 0;
    if (k1 - k0 == bs) {
      __m256i vsum = _mm256_setzero_si256();
      for (int k = k0; k < k1; k += kStep) vsum = _mm256_add_epi32(vsum, store_codes(x + k, _mm256_set1_ps(id), q + k));
      s = hsum(vsum);
    } else {
      for (int k = k0; k < k0 + bs; ++k) {
        const int v = k < k1 ? static_cast<int>(std::nearbyint(x[k] * id)) : 0;  // |v| <= kMax
        q[k] = static_cast<Code>(v);
        s += v;
      }
    }
    dx[b] = d;
    qsum[b] = s;
  }
}

void quantize_row(const float* x, int K, int bs, int8_t* q, float* dx, int32_t* qsum) {
  quantize_codes<int8_t, 127>(x, K, bs, q, dx, qsum);
}

void quantize_row16(const float* x, int K, int bs, int16_t* q, float* dx, int32_t* qsum) {
  quantize_codes<int16_t, 32767>(x, K, bs, q, dx, qsum);
}

// v as it is here: GCC may not reassociate a running sum across this point. Without it, the int16 sums of a
// sub-block were rebuilt as one balanced tree over all their maddubs, every product of every token live at once:
// 16 registers could not hold them and the loop spilled most of them to the stack.
inline void pin(__m256i& v) {
  __asm__("" : "+x"(v));
}

// act_bits 16: madd (int16 pairs' products summed into int32 lanes), then add (qlinear_group_dot.h Dots16); the
// running sums pinned as the int4 ones are (without, the NT = 4 loop spilled 84 vectors a block to the stack).
struct Dots16 {
  template <int NT>
  static void block(const uint8_t* codes, int sub_blocks, const int16_t* const* qs, __m256i* lo, __m256i* hi) {
    for (int t = 0; t < NT; ++t) lo[t] = hi[t] = _mm256_setzero_si256();
    for (int s = 0; s < sub_blocks; ++s, codes += 256) {
      for (int i = 0; i < 8; ++i) {
        __m256i wlo, whi;
        widen8(codes + 32 * i, &wlo, &whi);
        for (int t = 0; t < NT; ++t) {
          const __m256i xq = bcast_quad16(qs[t] + 32 * s + 4 * i);
          lo[t] = _mm256_add_epi32(lo[t], _mm256_madd_epi16(wlo, xq));
          hi[t] = _mm256_add_epi32(hi[t], _mm256_madd_epi16(whi, xq));
          pin(lo[t]), pin(hi[t]);
        }
      }
    }
  }
};

void group_dot16(const QGroup& g, const QTokens& x, int nt, float* out) {
  group_dot16_any<Dots16>(g, x, nt, out);
}

// Integer dots by _mm256_maddubs_epi16: int4 sums a sub-block's 8 products per row pair in int16 (each lane
// at most 16 * 15 * 127 = 30480, no overflow) and widens once by _mm256_madd_epi16; int8 uses
// |w| x sign(x, w) and widens each product pair (2 * 128 * 127 would overflow an int16 sum).
struct Dots {
  template <int NT>
  static void sub4(const uint8_t* sub, const int8_t* const* qs, __m256i* isum) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i p[NT];
    for (int j = 0; j < 4; ++j) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 32 * j));
      const __m256i wl = _mm256_and_si256(w, low), wh = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
      for (int t = 0; t < NT; ++t) {
        const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(wl, bcast_word(qs[t] + 8 * j)),
                                           _mm256_maddubs_epi16(wh, bcast_word(qs[t] + 8 * j + 4)));
        p[t] = j == 0 ? a : _mm256_add_epi16(p[t], a);
        pin(p[t]);
      }
    }
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p[t], _mm256_set1_epi16(1)));
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

// kMxfp4Table + kMxfp4Zero (0..24) in both 128-bit lanes: _mm256_shuffle_epi8 looks a nibble up per lane.
inline __m256i mxfp4_table() {
  alignas(16) uint8_t t[16];
  for (int i = 0; i < 16; ++i) t[i] = static_cast<uint8_t>(kMxfp4Table[i] + kMxfp4Zero);
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

// mxfp4 groups (qlinear.h): each nibble through the biased table by one shuffle (as llama.cpp's MXFP4 dot looks up
// kvalues_mxfp4; here unsigned, so the products are Dots::sub4's maddubs with no sign step per token), the zero point
// 12 qsum seeding isum. A maddubs lane is at most 2 * 24 * 127 = 6096: the int16 sums take two chunks (4 maddubs,
// 24384) before they are widened, two madds a sub-block where int4 has one. Exact integers: the scalar isum.
struct DotsMxfp4 {
  template <int NT>
  static void sub(const uint8_t* sub, __m256i table, const int8_t* const* qs, __m256i* isum) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256i p[NT];
    for (int j = 0; j < 4; ++j) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 32 * j));
      const __m256i wl = _mm256_shuffle_epi8(table, _mm256_and_si256(w, low));
      const __m256i wh = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w, 4), low));
      for (int t = 0; t < NT; ++t) {
        const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(wl, bcast_word(qs[t] + 8 * j)),
                                           _mm256_maddubs_epi16(wh, bcast_word(qs[t] + 8 * j + 4)));
        p[t] = (j & 1) == 0 ? a : _mm256_add_epi16(p[t], a);
        pin(p[t]);
        if (j & 1) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p[t], ones));
      }
    }
  }

  template <int NT, int BITS>
  static const uint8_t* block(const uint8_t* codes, int sub_blocks, const int8_t* const* qs, const int32_t* zs,
                              __m256i* isum) {
    static_assert(BITS == 4, "mxfp4 codes are 4-bit");
    const __m256i table = mxfp4_table();
    const int8_t* q[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_set1_epi32(-zs[t]), q[t] = qs[t];
    for (int s = 0; s < sub_blocks; ++s, codes += 128) {
      sub<NT>(codes, table, q, isum);
      for (int t = 0; t < NT; ++t) q[t] += 32;
    }
    return codes;
  }
};

void group_dot_mxfp4(const QGroup& g, const QTokens& x, int nt, float* out) {
  group_dot_bits<DotsMxfp4, 4>(g, x, nt, out);
}

// ---- two int4 groups of one weight at once (group_dot2): each broadcast word of a token's codes, and its dx, sx and
// zero-point term, feeds both groups' rows. Per sub-block and 32-byte chunk j, the two groups' codes are unpacked
// once (4 vectors) and every token adds its 4 maddubs into one int16 sum per group (at most 8 maddubs a sub-block,
// as Dots::sub4). Each lane's integer sum is Dots' exact isum and its float steps are group_dot_t's, so the bits
// are those of two group_dot calls. The driver pairs groups from kPairTokens tokens on (qlinear.cc).
// Tokens go two at a time: 4 int16 sums, 4 float accumulators (in registers across the blocks), 4 unpacked code
// vectors and a broadcast fit the 16 registers; with 4 tokens the accumulators went through memory each block.
// 576x3072 SwiGLU pairs at T = 16 (micro-bench, 1 thread): 4 at a time 387-392 us, 2 at a time 316-322 us.

// One sub-block of both groups (128 code bytes each at c0, c1) against NT tokens' 32 codes (token t's at q +
// t * stride): p0[t], p1[t] the int16 sums of the 8 maddubs per group.
template <int NT>
inline void pair_sub4(const uint8_t* c0, const uint8_t* c1, const int8_t* q, int64_t stride, __m256i* p0, __m256i* p1) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + 32 * j));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + 32 * j));
    const __m256i w0l = _mm256_and_si256(w0, low), w0h = _mm256_and_si256(_mm256_srli_epi16(w0, 4), low);
    const __m256i w1l = _mm256_and_si256(w1, low), w1h = _mm256_and_si256(_mm256_srli_epi16(w1, 4), low);
    for (int t = 0; t < NT; ++t) {
      const __m256i xl = bcast_word(q + t * stride + 8 * j);
      const __m256i l0 = _mm256_maddubs_epi16(w0l, xl), l1 = _mm256_maddubs_epi16(w1l, xl);
      p0[t] = j == 0 ? l0 : _mm256_add_epi16(p0[t], l0);
      p1[t] = j == 0 ? l1 : _mm256_add_epi16(p1[t], l1);
      pin(p0[t]), pin(p1[t]);
      const __m256i xh = bcast_word(q + t * stride + 8 * j + 4);
      p0[t] = _mm256_add_epi16(p0[t], _mm256_maddubs_epi16(w0h, xh));
      p1[t] = _mm256_add_epi16(p1[t], _mm256_maddubs_epi16(w1h, xh));
      pin(p0[t]), pin(p1[t]);
    }
  }
}

template <int NT>
void group_dot2_t(const QGroup& g0, const QGroup& g1, const QTokens& x, float* out0, float* out1) {
  const int sub_blocks = g0.bs / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t *c0 = g0.codes, *c1 = g1.codes;
  __m256 a0[NT], a1[NT];
  for (int t = 0; t < NT; ++t) a0[t] = _mm256_loadu_ps(out0 + 8 * t), a1[t] = _mm256_loadu_ps(out1 + 8 * t);
  for (int b = 0; b < g0.kb; ++b) {
    const int8_t* q = x.q + b * g0.bs;
    __m256i p0[NT], p1[NT], i0[NT], i1[NT];
    pair_sub4<NT>(c0, c1, q, x.q_stride, p0, p1);
    for (int t = 0; t < NT; ++t) i0[t] = _mm256_madd_epi16(p0[t], ones), i1[t] = _mm256_madd_epi16(p1[t], ones);
    for (int s = 1; s < sub_blocks; ++s) {
      pair_sub4<NT>(c0 + 128 * s, c1 + 128 * s, q + 32 * s, x.q_stride, p0, p1);
      for (int t = 0; t < NT; ++t) {
        i0[t] = _mm256_add_epi32(i0[t], _mm256_madd_epi16(p0[t], ones));
        i1[t] = _mm256_add_epi32(i1[t], _mm256_madd_epi16(p1[t], ones));
      }
    }
    c0 += 128 * sub_blocks, c1 += 128 * sub_blocks;
    const __m256 d0 = load_f16x8(g0.d + b * 8), d1 = load_f16x8(g1.d + b * 8);
    for (int t = 0; t < NT; ++t) {
      const int tb = t * g0.kb + b;
      const __m256i z = _mm256_set1_epi32(x.zsum[tb]);
      const __m256 dx = _mm256_set1_ps(x.dx[tb]);
      a0[t] = _mm256_fmadd_ps(_mm256_mul_ps(d0, dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(i0[t], z)), a0[t]);
      a1[t] = _mm256_fmadd_ps(_mm256_mul_ps(d1, dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(i1[t], z)), a1[t]);
    }
    if (g0.m) {
      const __m256 m0 = load_f16x8(g0.m + b * 8), m1 = load_f16x8(g1.m + b * 8);
      for (int t = 0; t < NT; ++t) {
        const __m256 sx = _mm256_set1_ps(x.sx[t * g0.kb + b]);
        a0[t] = _mm256_fmadd_ps(m0, sx, a0[t]);
        a1[t] = _mm256_fmadd_ps(m1, sx, a1[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out0 + 8 * t, a0[t]), _mm256_storeu_ps(out1 + 8 * t, a1[t]);
}

void group_dot2(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0, float* out1) {
  if (g0.bits != 4) {
    group_dot(g0, x, nt, out0);
    group_dot(g1, x, nt, out1);
    return;
  }
  int t = 0;
  for (; t + 2 <= nt; t += 2) group_dot2_t<2>(g0, g1, advance_tokens(x, t, g0.kb), out0 + 8 * t, out1 + 8 * t);
  if (t < nt) group_dot2_t<1>(g0, g1, advance_tokens(x, t, g0.kb), out0 + 8 * t, out1 + 8 * t);
}

// ---- two mxfp4 groups at once (group_dot2_mxfp4): group_dot2's pairing with DotsMxfp4's products. Per sub-block and
// chunk j both groups' nibbles are looked up once (4 shuffles) for the tokens; each token's int16 sums take two chunks
// before they are widened (DotsMxfp4's bound), straight into the int32 sums. The same exact isum and group_dot_t's
// float steps (mxfp4 has no m): the bits of two group_dot_mxfp4 calls.
template <int NT>
inline void pair_sub_mxfp4(const uint8_t* c0, const uint8_t* c1, __m256i table, const int8_t* q, int64_t stride,
                           __m256i* i0, __m256i* i1) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i p0[NT], p1[NT];
  for (int j = 0; j < 4; ++j) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + 32 * j));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + 32 * j));
    const __m256i w0l = _mm256_shuffle_epi8(table, _mm256_and_si256(w0, low));
    const __m256i w0h = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w0, 4), low));
    const __m256i w1l = _mm256_shuffle_epi8(table, _mm256_and_si256(w1, low));
    const __m256i w1h = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w1, 4), low));
    for (int t = 0; t < NT; ++t) {
      const __m256i xl = bcast_word(q + t * stride + 8 * j), xh = bcast_word(q + t * stride + 8 * j + 4);
      const __m256i a0 = _mm256_add_epi16(_mm256_maddubs_epi16(w0l, xl), _mm256_maddubs_epi16(w0h, xh));
      const __m256i a1 = _mm256_add_epi16(_mm256_maddubs_epi16(w1l, xl), _mm256_maddubs_epi16(w1h, xh));
      p0[t] = (j & 1) == 0 ? a0 : _mm256_add_epi16(p0[t], a0);
      p1[t] = (j & 1) == 0 ? a1 : _mm256_add_epi16(p1[t], a1);
      pin(p0[t]), pin(p1[t]);
      if (j & 1) {
        i0[t] = _mm256_add_epi32(i0[t], _mm256_madd_epi16(p0[t], ones));
        i1[t] = _mm256_add_epi32(i1[t], _mm256_madd_epi16(p1[t], ones));
      }
    }
  }
}

template <int NT>
void group_dot2_mxfp4_t(const QGroup& g0, const QGroup& g1, const QTokens& x, float* out0, float* out1) {
  const int sub_blocks = g0.bs / 32;
  const __m256i table = mxfp4_table();
  const uint8_t *c0 = g0.codes, *c1 = g1.codes;
  __m256 a0[NT], a1[NT];
  for (int t = 0; t < NT; ++t) a0[t] = _mm256_loadu_ps(out0 + 8 * t), a1[t] = _mm256_loadu_ps(out1 + 8 * t);
  for (int b = 0; b < g0.kb; ++b) {
    const int8_t* q = x.q + b * g0.bs;
    __m256i i0[NT], i1[NT];
    for (int t = 0; t < NT; ++t) i0[t] = i1[t] = _mm256_setzero_si256();
    for (int s = 0; s < sub_blocks; ++s)
      pair_sub_mxfp4<NT>(c0 + 128 * s, c1 + 128 * s, table, q + 32 * s, x.q_stride, i0, i1);
    c0 += 128 * sub_blocks, c1 += 128 * sub_blocks;
    const __m256 d0 = load_f16x8(g0.d + b * 8), d1 = load_f16x8(g1.d + b * 8);
    for (int t = 0; t < NT; ++t) {
      const int tb = t * g0.kb + b;
      const __m256i z = _mm256_set1_epi32(x.zsum[tb]);
      const __m256 dx = _mm256_set1_ps(x.dx[tb]);
      a0[t] = _mm256_fmadd_ps(_mm256_mul_ps(d0, dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(i0[t], z)), a0[t]);
      a1[t] = _mm256_fmadd_ps(_mm256_mul_ps(d1, dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(i1[t], z)), a1[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out0 + 8 * t, a0[t]), _mm256_storeu_ps(out1 + 8 * t, a1[t]);
}

void group_dot2_mxfp4(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0, float* out1) {
  int t = 0;
  for (; t + 2 <= nt; t += 2) group_dot2_mxfp4_t<2>(g0, g1, advance_tokens(x, t, g0.kb), out0 + 8 * t, out1 + 8 * t);
  if (t < nt) group_dot2_mxfp4_t<1>(g0, g1, advance_tokens(x, t, g0.kb), out0 + 8 * t, out1 + 8 * t);
}

// Lanes r0..r0+7 of A's ranks (fewer than 8 left: the rest masked off, never read) for one k-quad.
inline __m256i load_ranks(const int8_t* quad, int left) {
  if (left >= 8) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_epi32(reinterpret_cast<const int*>(quad), _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane));
}

inline __m256 load_f16_ranks(const uint16_t* p, int left) {
  if (left >= 8) return load_f16x8(p);
  alignas(16) uint16_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(v, p, sizeof(uint16_t) * left);
  return load_f16x8(v);
}

// 8 ranks of one segment's A: a 256-bit vector of the shrink (fewer left: the rest masked off, never read).
struct RankVec {
  const int8_t* A;
  const uint16_t* sA;
  int lda, r0, left;
  float* const* h;
};

// h[t][r0..r0+7] of V rank vectors (of one segment or several) for NT tokens, in one pass over the tokens' codes
// (the V blocks of A stream side by side): per 32-chunk of K the exact integer dots |A| x sign(x, A) (maddubs,
// widened per word), then fma(dx * sA, isum, acc) in chunk order; per lane the steps of one vector alone.
template <int NT, int V>
void shrink_vecs(const QLoraToken* x, int K, int bs, const RankVec* rv) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int kc = (K + kLoraChunk - 1) / kLoraChunk;
  __m256 acc[NT][V];
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < V; ++v) acc[t][v] = _mm256_setzero_ps();
  for (int c = 0; c < kc; ++c) {
    __m256i isum[NT][V];
    for (int t = 0; t < NT; ++t)
      for (int v = 0; v < V; ++v) isum[t][v] = _mm256_setzero_si256();
    const int w1 = (K < (c + 1) * kLoraChunk ? K : (c + 1) * kLoraChunk) / 4;
    for (int w = c * kLoraChunk / 4; w < w1; ++w) {
      for (int v = 0; v < V; ++v) {
        const int8_t* quad = rv[v].A + (static_cast<int64_t>(w) * rv[v].lda + rv[v].r0) * 4;
        _mm_prefetch(reinterpret_cast<const char*>(quad) + kLoraPrefetchA, _MM_HINT_T0);  // never faults
        const __m256i a = load_ranks(quad, rv[v].left);
        const __m256i aa = _mm256_abs_epi8(a);
        for (int t = 0; t < NT; ++t) {
          const __m256i p = _mm256_maddubs_epi16(aa, _mm256_sign_epi8(bcast_word(x[t].q + 4 * w), a));
          isum[t][v] = _mm256_add_epi32(isum[t][v], _mm256_madd_epi16(p, ones));
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const __m256 sa = load_f16_ranks(rv[v].sA + static_cast<int64_t>(c) * rv[v].lda + rv[v].r0, rv[v].left);
      for (int t = 0; t < NT; ++t) {
        const __m256 dsa = _mm256_mul_ps(_mm256_set1_ps(x[t].dx[c * kLoraChunk / bs]), sa);
        acc[t][v] = _mm256_fmadd_ps(dsa, _mm256_cvtepi32_ps(isum[t][v]), acc[t][v]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < V; ++v) {
      alignas(32) float out[8];
      _mm256_store_ps(out, acc[t][v]);
      std::memcpy(rv[v].h[t] + rv[v].r0, out, sizeof(float) * (rv[v].left < 8 ? rv[v].left : 8));
    }
}

struct Shrink {
  using Vec = RankVec;
  static RankVec make(const QLoraShrink& s, int r0) { return {s.A, s.sA, s.lda, r0, s.rank - r0, s.h}; }
  template <int NT, int V>
  static void pass(const QLoraToken* x, int K, int bs, const RankVec* v) {
    shrink_vecs<NT, V>(x, K, bs, v);
  }
};

void lora_shrink(const QLoraToken* x, int n, int K, int bs, const QLoraShrink* s, int ns) {
  lora_shrink_passes<Shrink, 8>(x, n, K, bs, s, ns);
}

// 8 columns at a time: per rank quad, 32 codes (4 ranks of 8 columns, one column a 32-bit lane) against a broadcast
// word of the token's 4 h codes, as the shrink does it: |B| (once per load, shared by the tokens) x sign(qh, B)
// (maddubs, widened per word); the columns past the last multiple of 8 as the scalar path does them (the same
// operations).
template <int NT>
void expand_t(const int8_t* const* qh, const float* coef, int quads, const int8_t* B, int64_t width, const uint16_t* sB,
              float* const* out, int64_t ostride) {
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t i = 0;
  for (; i + 8 <= width; i += 8) {
    __m256i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
    for (int p = 0; p < quads; ++p) {
      if (i % 16 == 0)  // once per cache line of the row (16 columns)
        _mm_prefetch(reinterpret_cast<const char*>(B + (p * width + i + kLoraPrefetchB) * 4), _MM_HINT_T0);
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B + (p * width + i) * 4));
      const __m256i ab = _mm256_abs_epi8(b);
      for (int t = 0; t < NT; ++t) {
        const __m256i s = _mm256_maddubs_epi16(ab, _mm256_sign_epi8(bcast_word(qh[t] + 4 * p), b));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s, ones));
      }
    }
    const __m256 sb = load_f16x8(sB + i);
    for (int t = 0; t < NT; ++t)
      _mm256_storeu_ps(out[t] + i / 8 * ostride,
                       _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(coef[t]), sb), _mm256_cvtepi32_ps(isum[t])));
  }
  for (; i < width; ++i) {
    for (int t = 0; t < NT; ++t) {
      int32_t isum = 0;
      for (int r = 0; r < 4 * quads; ++r) isum += qh[t][r] * B[(r / 4 * width + i) * 4 + r % 4];
      out[t][i / 8 * ostride + i % 8] = (coef[t] * _cvtsh_ss(sB[i])) * static_cast<float>(isum);
    }
  }
}

void lora_expand(const int8_t* const* qh, const float* coef, int n, int quads, const int8_t* B, int64_t width,
                 const uint16_t* sB, float* const* out, int64_t ostride) {
  with_tokens(n, [&](auto nt) { expand_t<decltype(nt)::value>(qh, coef, quads, B, width, sB, out, ostride); });
}

// partial i of the scalar path is lane i % 4 of p[i / 4]; x[k]^2 is exact in double, so a fused multiply-add
// rounds as the multiply and the add do
void rms_norm_row(const float* x, int K, const float* w, float eps, float* xn) {
  __m256d p[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    p[0] = _mm256_fmadd_pd(lo, lo, p[0]);
    p[1] = _mm256_fmadd_pd(hi, hi, p[1]);
  }
  alignas(32) double part[8];
  _mm256_store_pd(part, p[0]);
  _mm256_store_pd(part + 4, p[1]);
  for (; k < K; ++k) part[k % 8] += static_cast<double>(x[k]) * x[k];
  const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(K) + eps));
  const __m256 vinv = _mm256_set1_ps(inv);
  for (k = 0; k + 8 <= K; k += 8)
    _mm256_storeu_ps(xn + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv), _mm256_loadu_ps(w + k)));
  for (; k < K; ++k) xn[k] = (x[k] * inv) * w[k];
}

// sigmoid(s) = 1 / (1 + e^-s) for s >= 0, e^s / (1 + e^s) below: e = exp(-|s|) never overflows.
__m256 sigmoid8(__m256 s) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 e = exp256(_mm256_or_ps(s, _mm256_set1_ps(-0.f)));  // exp(-|s|)
  const __m256 pos = _mm256_div_ps(one, _mm256_add_ps(one, e));
  const __m256 neg = _mm256_div_ps(e, _mm256_add_ps(one, e));
  return _mm256_blendv_ps(neg, pos, _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GE_OQ));
}

// DoRA's multiply (QLinearIsa::mul8): one aligned 32-byte store (an unaligned one is split in two 16-byte halves
// under generic tuning).
void mul8(const float* v, const float* g, float* out) {
  _mm256_store_ps(out, _mm256_mul_ps(_mm256_loadu_ps(v), _mm256_loadu_ps(g)));
}

void silu_mul8(const float* g, const float* u, float* out) {
  const __m256 gv = _mm256_loadu_ps(g);
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid8(gv)), _mm256_loadu_ps(u)));
}

// the scalar path's rounding steps, unfused: 2 z = g * (a + b * (g * g))
void gelu_mul8(const float* g, const float* u, float* out) {
  const __m256 gv = _mm256_loadu_ps(g);
  const __m256 s = _mm256_mul_ps(
      gv, _mm256_add_ps(_mm256_set1_ps(kGeluA), _mm256_mul_ps(_mm256_set1_ps(kGeluB), _mm256_mul_ps(gv, gv))));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid8(s)), _mm256_loadu_ps(u)));
}

}  // namespace
}  // namespace avx2
}  // namespace ortllm

#pragma GCC pop_options

namespace ortllm {
// Compiled for the baseline ISA: only hands out the table.
const QLinearIsa* qlinear_avx2_isa() {
  static const QLinearIsa isa = [] {
    QLinearIsa t{};
    t.name = "avx2";
    t.quantize_row = avx2::quantize_row;
    t.group_dot = avx2::group_dot;
    t.group_dot2 = avx2::group_dot2;
    t.lora_shrink = avx2::lora_shrink;
    t.lora_expand = avx2::lora_expand;
    t.silu_mul8 = avx2::silu_mul8;
    t.gelu_mul8 = avx2::gelu_mul8;
    t.rms_norm_row = avx2::rms_norm_row;
    t.quantize_row16 = avx2::quantize_row16;
    t.group_dot16 = avx2::group_dot16;
    t.mul8 = avx2::mul8;
    t.group_dot_mxfp4 = avx2::group_dot_mxfp4;  // avx512vnni and amx copy this table: theirs too (not run here)
    t.group_dot2_mxfp4 = avx2::group_dot2_mxfp4;
    return t;
  }();
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
