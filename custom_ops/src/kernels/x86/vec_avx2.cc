// AVX2/FMA versions of the VecOps table (see vec.h for the contract and shapes).
//
// Only this file's functions are compiled for AVX2+FMA+F16C (via `#pragma GCC target`, after every
// system header so no shared inline/template code gets AVX2 bodies); vec() selects this table at
// run time only when the CPU reports all three. Why these shapes:
//  - scores: up to three query rows against 4 key rows at a time (12 accumulators, each K load feeds
//    three FMAs), reduced by a hadd tree (one horizontal reduction per 4 scores instead of per score);
//  - pv: up to three output rows x 32 dims stay in registers across a whole key block (D = 64);
//  - scores_f16 / pv_f16: the same loops (templated on the row type) on an fp16 cache's rows, widened by
//    F16C as they are loaded: for a decode token's three rows each key and value is widened once, where a
//    widening pass into a scratch cost a second pass over every block (decode at context 2048: 0.55x the
//    time). Tiles of many rows still widen once and reuse the floats (paged_attention.cc kF16WidenRows);
//  - gemm_rows / gemm_rows_f16b: one 4x16 register-blocked micro-kernel (8 independent FMA chains)
//    over row-pointer arrays, templated on B's element type (fp32, or fp16 widened by F16C as it
//    streams); the fp16 one serves the LoRA shrink ([n, in] @ [in, r]) and expand ([n, r] @ [r, out])
//    and the block-offsets term ([T, k_blocks] @ [k_blocks, out]);
//  - fp8 codes become floats 8 lanes per step via exponent re-biasing (subnormals by the "add 2^-6 then
//    subtract" trick), so no lookup gathers;
//  - scores_q8 / pv_q16: up to three rows x four keys (x 16 dims) / two keys (x 32 dims) per step with the
//    int8 codes widened to int16 in registers once for all three rows (a decode token's kv head has G = 3
//    query heads in SmolLM2), summed exactly by madd.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../vec.h"
#include "int8_attention_loops.h"
#include "isa_x86.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "avx2_math.h"

namespace ortllm {
namespace avx2 {
namespace {

// ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)): the same tree as hsum4 below, so a score is the same
// bits whichever path computes it (one to three rows x four keys, one row x four keys, or a tail key): which path a
// key takes depends on how many rows and keys the tile has, i.e. on the batch and the prefill chunking.
inline float hsum(__m256 v) {
  __m256 t = _mm256_hadd_ps(v, v);
  t = _mm256_hadd_ps(t, t);
  return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

// [sum(a0), sum(a1), sum(a2), sum(a3)]
inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  __m256 t0 = _mm256_hadd_ps(a0, a1);
  __m256 t1 = _mm256_hadd_ps(a2, a3);
  __m256 t2 = _mm256_hadd_ps(t0, t1);
  return _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1));
}

// Loads of 8 consecutive entries as floats (load1: one): fp32 as is, fp16 bits (an fp16 KV cache's rows, the
// LoRA and block-offsets tables) widened by F16C as they are read, exactly, so a loop templated on the element
// type does the same fp32 operations on either.
inline __m256 load8(const float* b) {
  return _mm256_loadu_ps(b);
}
inline __m256 load8(const uint16_t* b) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
}
inline float load1(const float* b) {
  return *b;
}
inline float load1(const uint16_t* b) {
  return _cvtsh_ss(*b);
}

template <class KT>
float dot_tail(const float* a, const KT* b, int from, int D) {
  float s = 0.f;
  for (int d = from; d < D; ++d) s += a[d] * load1(b + d);
  return s;
}

// R query rows (R <= 3) x four keys per step: 4R accumulators, each key load (and fp16 widening) feeds R FMAs
// (D % 8 == 0). Every score is one 8-lane FMA chain over d, then hsum4's tree, then times alpha: the same bits
// for any R, and as the one-row loop in scores_t.
template <int R, class KT>
void scores_rx4(const float* Q, int D, const KT* K, int nkeys, float alpha, float* S, int lds) {
  const __m128 al = _mm_set1_ps(alpha);
  int j = 0;
  for (; j + 4 <= nkeys; j += 4) {
    const KT* k0 = K + static_cast<size_t>(j) * D;
    __m256 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
      for (int i = 0; i < 4; ++i) {
        const __m256 kv = load8(k0 + static_cast<size_t>(i) * D + d);
        for (int r = 0; r < R; ++r)
          acc[r][i] = _mm256_fmadd_ps(_mm256_loadu_ps(Q + static_cast<size_t>(r) * D + d), kv, acc[r][i]);
      }
    }
    for (int r = 0; r < R; ++r)
      _mm_storeu_ps(S + static_cast<size_t>(r) * lds + j,
                    _mm_mul_ps(hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), al));
  }
  for (; j < nkeys; ++j) {
    const KT* k0 = K + static_cast<size_t>(j) * D;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
      const __m256 kv = load8(k0 + d);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(Q + static_cast<size_t>(r) * D + d), kv, acc[r]);
    }
    for (int r = 0; r < R; ++r) S[static_cast<size_t>(r) * lds + j] = alpha * hsum(acc[r]);
  }
}

// One query row against every key, any D (the tail past D8 as scalar FMA-free sums, added after the tree).
template <class KT>
void scores_row(const float* q, const KT* K, int nkeys, int D, float alpha, float* s) {
  const int D8 = D & ~7;
  int j = 0;
  for (; j + 4 <= nkeys; j += 4) {
    const KT* k0 = K + static_cast<size_t>(j) * D;
    const KT* k1 = k0 + D;
    const KT* k2 = k1 + D;
    const KT* k3 = k2 + D;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int d = 0; d < D8; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, load8(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, load8(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, load8(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, load8(k3 + d), a3);
    }
    __m128 r4 = hsum4(a0, a1, a2, a3);
    if (D8 != D) {
      r4 = _mm_add_ps(r4, _mm_setr_ps(dot_tail(q, k0, D8, D), dot_tail(q, k1, D8, D), dot_tail(q, k2, D8, D),
                                      dot_tail(q, k3, D8, D)));
    }
    _mm_storeu_ps(s + j, _mm_mul_ps(r4, _mm_set1_ps(alpha)));
  }
  for (; j < nkeys; ++j) {
    const KT* k0 = K + static_cast<size_t>(j) * D;
    __m256 a0 = _mm256_setzero_ps();
    for (int d = 0; d < D8; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k0 + d), a0);
    s[j] = alpha * (hsum(a0) + dot_tail(q, k0, D8, D));
  }
}

// Rows three at a time (a decode token's G = 3 query heads of a kv head in SmolLM2 share each key load and, for
// fp16, its widening), then the 2 or 1 left; D % 8 != 0: one row at a time.
template <class KT>
void scores_t(const float* Q, int rows, const KT* K, int nkeys, int D, float alpha, float* S, int lds) {
  if (D % 8 != 0) {
    for (int r = 0; r < rows; ++r)
      scores_row(Q + static_cast<size_t>(r) * D, K, nkeys, D, alpha, S + static_cast<size_t>(r) * lds);
    return;
  }
  for_row_triples(rows, [&](auto R, int r) {
    scores_rx4<R>(Q + static_cast<size_t>(r) * D, D, K, nkeys, alpha, S + static_cast<size_t>(r) * lds, lds);
  });
}

void scores(const float* Q, int rows, const float* K, int nkeys, int D, float alpha, float* S, int lds) {
  scores_t(Q, rows, K, nkeys, D, alpha, S, lds);
}
void scores_f16(const float* Q, int rows, const uint16_t* K, int nkeys, int D, float alpha, float* S, int lds) {
  scores_t(Q, rows, K, nkeys, D, alpha, S, lds);
}

// R output rows x 32 dims per pass (4R accumulators): R broadcasts + 4 loads per 4R FMAs. D = 64: every output is
// fma(P_j, V_j, O) in key order, from O's value (no key skipped), for any R.
template <int R, class VT>
void pv64_rows(const float* P, int ldp, const VT* V, int nkeys, float* O) {
  for (int h = 0; h < 64; h += 32) {
    __m256 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_loadu_ps(O + static_cast<size_t>(r) * 64 + h + 8 * i);
    for (int j = 0; j < nkeys; ++j) {
      const VT* v = V + static_cast<size_t>(j) * 64 + h;
      __m256 w[R];
      for (int r = 0; r < R; ++r) w[r] = _mm256_broadcast_ss(P + static_cast<size_t>(r) * ldp + j);
      for (int i = 0; i < 4; ++i) {
        const __m256 x = load8(v + 8 * i);
        for (int r = 0; r < R; ++r) acc[r][i] = _mm256_fmadd_ps(w[r], x, acc[r][i]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(O + static_cast<size_t>(r) * 64 + h + 8 * i, acc[r][i]);
  }
}

// One output row x 64 dims (8 accumulators), the same operations as pv64_rows.
template <class VT>
void pv64_row(const float* p, const VT* V, int nkeys, float* o) {
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_loadu_ps(o + 8 * i);
  for (int j = 0; j < nkeys; ++j) {
    const __m256 w = _mm256_set1_ps(p[j]);
    const VT* v = V + static_cast<size_t>(j) * 64;
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(w, load8(v + 8 * i), acc[i]);
  }
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + 8 * i, acc[i]);
}

// Any D: a key whose weight is 0 adds nothing (skipped).
template <class VT>
void pv_any(const float* P, int ldp, int rows, const VT* V, int nkeys, int D, float* O) {
  const int D8 = D & ~7;
  for (int r = 0; r < rows; ++r) {
    float* o = O + static_cast<size_t>(r) * D;
    const float* p = P + static_cast<size_t>(r) * ldp;
    for (int j = 0; j < nkeys; ++j) {
      if (p[j] == 0.f) continue;
      const __m256 w = _mm256_set1_ps(p[j]);
      const VT* v = V + static_cast<size_t>(j) * D;
      int d = 0;
      for (; d < D8; d += 8) _mm256_storeu_ps(o + d, _mm256_fmadd_ps(w, load8(v + d), _mm256_loadu_ps(o + d)));
      for (; d < D; ++d) o[d] += p[j] * load1(v + d);
    }
  }
}

// D = 64: rows three at a time (each value load, and its fp16 widening, shared by three rows), then the 2 or 1
// left; other D: pv_any.
template <class VT>
void pv_t(const float* P, int ldp, int rows, const VT* V, int nkeys, int D, float* O) {
  if (D != 64) return pv_any(P, ldp, rows, V, nkeys, D, O);
  for_row_triples(rows, [&](auto R, int r) {
    if constexpr (R == 1)
      pv64_row(P + static_cast<size_t>(r) * ldp, V, nkeys, O + static_cast<size_t>(r) * 64);
    else
      pv64_rows<R>(P + static_cast<size_t>(r) * ldp, ldp, V, nkeys, O + static_cast<size_t>(r) * 64);
  });
}

void pv(const float* P, int ldp, int rows, const float* V, int nkeys, int D, float* O) {
  pv_t(P, ldp, rows, V, nkeys, D, O);
}
void pv_f16(const float* P, int ldp, int rows, const uint16_t* V, int nkeys, int D, float* O) {
  pv_t(P, ldp, rows, V, nkeys, D, O);
}

void widen_e4m3(const uint8_t* codes, int nrows, int D, float* out) {
  if (D % 8 != 0) return vec_scalar_ops().widen_e4m3(codes, nrows, D, out);
  const __m256i mag_mask = _mm256_set1_epi32(0x7F);
  const __m256i exp_mask = _mm256_set1_epi32(0x78);
  const __m256i sign_mask = _mm256_set1_epi32(0x80);
  const __m256i bias_norm = _mm256_set1_epi32(120 << 23);
  const __m256i bias_sub = _mm256_set1_epi32(121 << 23);
  const __m256 min_normal = _mm256_set1_ps(0.015625f);  // 2^-6
  const size_t n = static_cast<size_t>(nrows) * D;
  for (size_t i = 0; i < n; i += 8) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    __m256i x = _mm256_slli_epi32(_mm256_and_si256(b, mag_mask), 20);
    __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(x, bias_norm));
    __m256 sub = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_add_epi32(x, bias_sub)), min_normal);
    __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, exp_mask), _mm256_setzero_si256()));
    __m256 mag = _mm256_blendv_ps(normal, sub, is_sub);
    __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(b, sign_mask), 24));
    _mm256_storeu_ps(out + i, _mm256_or_ps(mag, sign));
  }
}

void scale_columns(float* S, int rows, int lds, const uint16_t* scales, int n) {
  alignas(32) float sc[64];
  for (int j0 = 0; j0 < n; j0 += 64) {
    const int m = n - j0 < 64 ? n - j0 : 64;
    int j = 0;
    for (; j + 8 <= m; j += 8)
      _mm256_store_ps(sc + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + j0 + j))));
    for (; j < m; ++j) sc[j] = _cvtsh_ss(scales[j0 + j]);
    for (int r = 0; r < rows; ++r) {
      float* s = S + static_cast<size_t>(r) * lds + j0;
      j = 0;
      for (; j + 8 <= m; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), _mm256_load_ps(sc + j)));
      for (; j < m; ++j) s[j] *= sc[j];
    }
  }
}

// [sum(a0), sum(a1), sum(a2), sum(a3)] of 32-bit integer lanes (exact: any order gives the same sums).
inline __m128i hsum4_epi32(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

inline __m256i widen16(const void* p) {  // 16 int8 -> 16 int16
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
}

// R rows (R <= 3) x four keys per step, 16 dims at a time as int16 pairs (madd: exact 32-bit sums); the
// keys' codes widened once for the R rows. A compile-time D (64 or 128), so the accumulators stay in registers.
template <int R, int D>
void scores_q8_rows(const int8_t* Qc, const float* qmul, const uint8_t* K, const uint16_t* scales, int nkeys, float* S,
                    int lds) {
  for (int j = 0; j < nkeys; j += 4) {
    const int nk = nkeys - j < 4 ? nkeys - j : 4;
    __m256i acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_si256();
    for (int d = 0; d < D; d += 16) {
      __m256i q[R];
      for (int r = 0; r < R; ++r) q[r] = widen16(Qc + static_cast<size_t>(r) * D + d);
      for (int c = 0; c < 4; ++c) {  // past the last key (a tail): repeat it (no branch; never stored)
        const __m256i kv = widen16(K + static_cast<size_t>(c < nk ? j + c : nkeys - 1) * D + d);
        for (int r = 0; r < R; ++r) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(q[r], kv));
      }
    }
    if (nk == 4) {
      const __m128 s4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + j)));
      for (int r = 0; r < R; ++r) {
        const __m128 dots = _mm_cvtepi32_ps(hsum4_epi32(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        _mm_storeu_ps(S + static_cast<size_t>(r) * lds + j, _mm_mul_ps(_mm_mul_ps(dots, _mm_set1_ps(qmul[r])), s4));
      }
      continue;
    }
    for (int r = 0; r < R; ++r) {  // a tail of 1-3 keys
      alignas(16) int32_t dots[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(dots), hsum4_epi32(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
      for (int c = 0; c < nk; ++c)
        S[static_cast<size_t>(r) * lds + j + c] = (static_cast<float>(dots[c]) * qmul[r]) * _cvtsh_ss(scales[j + c]);
    }
  }
}

template <int D>
void scores_q8_d(const int8_t* Qc, const float* qmul, int rows, const uint8_t* K, const uint16_t* scales, int nkeys,
                 float* S, int lds) {
  for_row_triples(rows, [&](auto R, int r) {
    scores_q8_rows<R, D>(Qc + static_cast<size_t>(r) * D, qmul + r, K, scales, nkeys, S + static_cast<size_t>(r) * lds,
                         lds);
  });
}

void scores_q8(const int8_t* Qc, const float* qmul, int rows, const uint8_t* K, const uint16_t* scales, int nkeys,
               int D, float* S, int lds) {
  if (D == 64) return scores_q8_d<64>(Qc, qmul, rows, K, scales, nkeys, S, lds);
  if (D == 128) return scores_q8_d<128>(Qc, qmul, rows, K, scales, nkeys, S, lds);
  vec_scalar_ops().scores_q8(Qc, qmul, rows, K, scales, nkeys, D, S, lds);
}

// R rows (R <= 3) x 32 dims per pass, two keys per step: their codes interleaved byte by byte (key j, key j + 1)
// and widened to int16 pairs, so one madd gives 8 dims' w_j v_j + w_j+1 v_j+1 (exact); D % 32 == 0.
template <int R>
void pv_q16_rows(const int16_t* W, int ldw, const float* wscale, const uint8_t* V, int nkeys, int D, float* O) {
  for (int h = 0; h < D; h += 32) {
    __m256i acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_si256();
    for (int j = 0; j < nkeys; j += 2) {
      const uint8_t* v = V + static_cast<size_t>(j) * D + h;
      const bool pair = j + 1 < nkeys;
      __m256i x[4];
      for (int half = 0; half < 2; ++half) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 16 * half));
        const __m128i b =
            pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + D + 16 * half)) : _mm_setzero_si128();
        x[2 * half] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
        x[2 * half + 1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i wp = _mm256_set1_epi32(weight_pair(W + static_cast<size_t>(r) * ldw, j, nkeys));
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(x[c], wp));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 ws = _mm256_set1_ps(wscale[r]);
      float* o = O + static_cast<size_t>(r) * D + h;
      for (int c = 0; c < 4; ++c)
        _mm256_storeu_ps(o + 8 * c, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][c]), ws, _mm256_loadu_ps(o + 8 * c)));
    }
  }
}

void pv_q16(const int16_t* W, int ldw, const float* wscale, int rows, const uint8_t* V, int nkeys, int D, float* O) {
  if (D % 32 != 0) return vec_scalar_ops().pv_q16(W, ldw, wscale, rows, V, nkeys, D, O);
  for_row_triples(rows, [&](auto R, int r) {
    pv_q16_rows<R>(W + static_cast<size_t>(r) * ldw, ldw, wscale + r, V, nkeys, D, O + static_cast<size_t>(r) * D);
  });
}

float weights_q16(const float* w, int n, int16_t* codes) {
  __m256 m8 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(w + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float mx = 0.f;
  for (float x : lanes) mx = x > mx ? x : mx;
  for (; i < n; ++i) mx = w[i] > mx ? w[i] : mx;
  if (!(mx > 0.f)) {
    std::memset(codes, 0, sizeof(int16_t) * static_cast<size_t>(n));
    return 0.f;
  }
  const float inv = 32767.f / mx;
  const __m256 iv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8) {  // round half to even (the default MXCSR mode), as nearbyint
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(w + i), iv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i),
                     _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
  }
  for (; i < n; ++i) codes[i] = static_cast<int16_t>(std::nearbyint(w[i] * inv));
  return mx / 32767.f;
}

float exp_sum(float* x, int n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float s = hsum(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  return s;
}

float vmax(const float* x, int n) {
  float m = x[0];
  int i = 0;
  if (n >= 8) {
    __m256 acc = _mm256_loadu_ps(x);
    for (i = 8; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    m = _mm_cvtss_f32(h);
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Per lane: its largest value and the first index holding it (a later one only when strictly larger); then the
// largest lane value at the smallest index, then the tail (strictly larger). The scalar loop's first maximum.
int vargmax(const float* x, int n) {
  int k = 0, i = 1;
  if (n >= 16) {
    __m256 best = _mm256_loadu_ps(x);
    __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = at;
    const __m256i eight = _mm256_set1_epi32(8);
    for (i = 8; i + 8 <= n; i += 8) {
      idx = _mm256_add_epi32(idx, eight);
      const __m256 v = _mm256_loadu_ps(x + i);
      const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
      best = _mm256_blendv_ps(best, v, gt);
      at = _mm256_blendv_epi8(at, idx, _mm256_castps_si256(gt));
    }
    alignas(32) float bv[8];
    alignas(32) int32_t bi[8];
    _mm256_store_ps(bv, best);
    _mm256_store_si256(reinterpret_cast<__m256i*>(bi), at);
    k = bi[0];
    for (int l = 1; l < 8; ++l)
      if (bv[l] > x[k] || (bv[l] == x[k] && bi[l] < k)) k = bi[l];
  }
  for (; i < n; ++i)
    if (x[i] > x[k]) k = i;
  return k;
}

void scal(float* y, int n, float a) {
  const __m256 av = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), av));
  for (; i < n; ++i) y[i] *= a;
}

// C[i][n0:n0+16] += alpha * sum_k A[i][k] * B[k][n0:n0+16], i < MR (MR <= 4): 2*MR independent
// accumulators starting at zero, alpha applied once at the end; A entries are memory broadcasts.
template <int MR, class TB>
inline void micro16(int K, float alpha, const float* const* A, const TB* B, int ldb, float* const* C, int n0) {
  __m256 c0[MR], c1[MR];
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm256_setzero_ps();
  for (int k = 0; k < K; ++k) {
    const TB* b = B + static_cast<size_t>(k) * ldb + n0;
    const __m256 b0 = load8(b);
    const __m256 b1 = load8(b + 8);
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(A[i] + k);
      c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
    }
  }
  const __m256 al = _mm256_set1_ps(alpha);
  for (int i = 0; i < MR; ++i) {
    float* c = C[i] + n0;
    _mm256_storeu_ps(c, _mm256_fmadd_ps(al, c0[i], _mm256_loadu_ps(c)));
    _mm256_storeu_ps(c + 8, _mm256_fmadd_ps(al, c1[i], _mm256_loadu_ps(c + 8)));
  }
}

template <int MR, class TB>
inline void micro8(int K, float alpha, const float* const* A, const TB* B, int ldb, float* const* C, int n0) {
  __m256 c0[MR];
  for (int i = 0; i < MR; ++i) c0[i] = _mm256_setzero_ps();
  for (int k = 0; k < K; ++k) {
    const __m256 b0 = load8(B + static_cast<size_t>(k) * ldb + n0);
    for (int i = 0; i < MR; ++i) c0[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(A[i] + k), b0, c0[i]);
  }
  const __m256 al = _mm256_set1_ps(alpha);
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(C[i] + n0, _mm256_fmadd_ps(al, c0[i], _mm256_loadu_ps(C[i] + n0)));
}

template <int MR, class TB>
void gemm_mr(int N, int K, float alpha, const float* const* A, const TB* B, int ldb, float* const* C) {
  int n = 0;
  for (; n + 16 <= N; n += 16) micro16<MR>(K, alpha, A, B, ldb, C, n);
  for (; n + 8 <= N; n += 8) micro8<MR>(K, alpha, A, B, ldb, C, n);
  for (; n < N; ++n) {
    for (int i = 0; i < MR; ++i) {
      float acc = 0.f;
      for (int k = 0; k < K; ++k) acc += A[i][k] * load1(B + static_cast<size_t>(k) * ldb + n);
      C[i][n] += alpha * acc;
    }
  }
}

template <class TB>
void gemm_rows_t(int M, int N, int K, float alpha, const float* const* A, const TB* B, int ldb, float* const* C) {
  int m = 0;
  for (; m + 4 <= M; m += 4) gemm_mr<4>(N, K, alpha, A + m, B, ldb, C + m);
  switch (M - m) {
    case 3:
      gemm_mr<3>(N, K, alpha, A + m, B, ldb, C + m);
      break;
    case 2:
      gemm_mr<2>(N, K, alpha, A + m, B, ldb, C + m);
      break;
    case 1:
      gemm_mr<1>(N, K, alpha, A + m, B, ldb, C + m);
      break;
    default:
      break;
  }
}

void gemm_rows(int M, int N, int K, float alpha, const float* const* A, const float* B, int ldb, float* const* C) {
  gemm_rows_t(M, N, K, alpha, A, B, ldb, C);
}

void gemm_rows_f16b(int M, int N, int K, float alpha, const float* const* A, const uint16_t* B, int ldb,
                    float* const* C) {
  gemm_rows_t(M, N, K, alpha, A, B, ldb, C);
}

// The scalar fwht's butterflies (stride 1, 2, 4 inside each 8-float vector by shuffles, then 8, 16, ...
// across vectors) and its final multiply: each output of a stage is the same a + b or a - b, so the same bits.
void fwht(float* x, int D) {
  if (D < 8) return vec_scalar_ops().fwht(x, D);
  for (int i = 0; i < D; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    // stride 1: lanes (0,1), (2,3), ...: [a+b, a-b]
    __m256 a = _mm256_permute_ps(v, _MM_SHUFFLE(2, 2, 0, 0)), b = _mm256_permute_ps(v, _MM_SHUFFLE(3, 3, 1, 1));
    v = _mm256_blend_ps(_mm256_add_ps(a, b), _mm256_sub_ps(a, b), 0xAA);
    // stride 2: lanes (0,2), (1,3) of each half
    a = _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 1, 0));
    b = _mm256_permute_ps(v, _MM_SHUFFLE(3, 2, 3, 2));
    v = _mm256_blend_ps(_mm256_add_ps(a, b), _mm256_sub_ps(a, b), 0xCC);
    // stride 4: lanes (0,4), (1,5), ...
    a = _mm256_permute2f128_ps(v, v, 0x00);
    b = _mm256_permute2f128_ps(v, v, 0x11);
    v = _mm256_blend_ps(_mm256_add_ps(a, b), _mm256_sub_ps(a, b), 0xF0);
    _mm256_storeu_ps(x + i, v);
  }
  for (int h = 8; h < D; h *= 2) {
    for (int i = 0; i < D; i += 2 * h) {
      for (int j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(D));
  const __m256 nv = _mm256_set1_ps(norm);
  for (int i = 0; i < D; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), nv));
}

// The scalar loop's nibbles 32 (then 16) at a time: low nibble - 8 to the first half, high nibble - 8 to the second.
// D % 32 == 0 (half a whole number of 16-byte steps); other head sizes take the scalar loop.
void unpack_q4(const uint8_t* packed, int nrows, int D, uint8_t* codes) {
  if (D % 32 != 0) return vec_scalar_ops().unpack_q4(packed, nrows, D, codes);
  const int half = D / 2;
  const __m256i mask = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8);
  for (int j = 0; j < nrows; ++j, packed += half, codes += D) {
    int i = 0;
    for (; i + 32 <= half; i += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + i));
      const __m256i lo = _mm256_sub_epi8(_mm256_and_si256(v, mask), eight);
      const __m256i hi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), mask), eight);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + half + i), hi);
    }
    for (; i + 16 <= half; i += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + i));
      const __m128i m = _mm256_castsi256_si128(mask), e = _mm256_castsi256_si128(eight);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm_sub_epi8(_mm_and_si128(v, m), e));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + half + i),
                       _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), e));
    }
  }
}

// The scalar loop's operations 8 at a time: x / scale, + 1.5 * 2^23 - 1.5 * 2^23 (round half to even),
// clamp to +-127 (NaN passes the clamp as in the scalar ?:), NaN -> 0, then to bytes (exact: |q| <= 127).
void quantize_i8_codes(const float* x, int D, float scale, uint8_t* codes) {
  const __m256 s = _mm256_set1_ps(scale), magic = _mm256_set1_ps(12582912.0f);
  const __m256 hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
  int i = 0;
  for (; i + 8 <= D; i += 8) {
    __m256 q = _mm256_sub_ps(_mm256_add_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), s), magic), magic);
    q = _mm256_blendv_ps(q, hi, _mm256_cmp_ps(q, hi, _CMP_GT_OQ));
    q = _mm256_blendv_ps(q, lo, _mm256_cmp_ps(q, lo, _CMP_LT_OQ));
    q = _mm256_andnot_ps(_mm256_cmp_ps(q, q, _CMP_UNORD_Q), q);
    const __m256i n = _mm256_cvtps_epi32(q);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(n), _mm256_extracti128_si256(n, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packs_epi16(w, w));
  }
  if (i < D) vec_scalar_ops().quantize_i8_codes(x + i, D - i, scale, codes + i);
}

void widen_f16(const uint16_t* h, int n, float* out) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(h[i]);
}

// max |x_i| (vec.h): four SSE lanes of four accumulators, then the tail as the scalar loop; the scalar loop's one
// chain of dependent maxss took ~55 ns a row, and a token's rows take 15 (a third of writing them, measured in the
// engine).
float absmax(const float* x, int D) {
  float m = 0.f;
  int i = 0;
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128 acc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
  for (; i + 16 <= D; i += 16)
    for (int k = 0; k < 4; ++k)  // _mm_max_ps(a, m) = a > m ? a : m, lane by lane: a NaN keeps m
      acc[k] = _mm_max_ps(_mm_and_ps(_mm_loadu_ps(x + i + 4 * k), abs_mask), acc[k]);
  alignas(16) float lanes[16];
  for (int k = 0; k < 4; ++k) _mm_store_ps(lanes + 4 * k, acc[k]);
  for (float a : lanes) m = a > m ? a : m;
  for (; i < D; ++i) {
    const float a = std::fabs(x[i]);
    m = a > m ? a : m;
  }
  return m;
}

}  // namespace
}  // namespace avx2
}  // namespace ortllm

#pragma GCC pop_options

namespace ortllm {
// Compiled for the baseline ISA: only hands out the table, never runs AVX2 code itself.
const VecOps* vec_avx2_ops() {
  static const VecOps ops = [] {
    VecOps t{};
    t.name = "avx2";
    t.scores = avx2::scores;
    t.pv = avx2::pv;
    t.widen_e4m3 = avx2::widen_e4m3;
    t.unpack_q4 = avx2::unpack_q4;
    t.scale_columns = avx2::scale_columns;
    t.scores_q8 = avx2::scores_q8;
    t.pv_q16 = avx2::pv_q16;
    t.weights_q16 = avx2::weights_q16;
    t.exp_sum = avx2::exp_sum;
    t.max = avx2::vmax;
    t.absmax = avx2::absmax;
    t.argmax = avx2::vargmax;
    t.scal = avx2::scal;
    t.gemm_rows = avx2::gemm_rows;
    t.gemm_rows_f16b = avx2::gemm_rows_f16b;
    t.fwht = avx2::fwht;
    t.quantize_i8_codes = avx2::quantize_i8_codes;
    t.widen_f16 = avx2::widen_f16;
    t.scores_f16 = avx2::scores_f16;
    t.pv_f16 = avx2::pv_f16;
    return t;
  }();
  return &ops;
}
}  // namespace ortllm
#else
namespace ortllm {
const VecOps* vec_avx2_ops() {
  return nullptr;
}
}  // namespace ortllm
#endif
