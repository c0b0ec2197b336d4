// AVX-512 VNNI versions of PagedAttention's two integer dots on int8 caches (scores_q8, pv_q16), picked at run
// time where the CPU has AVX-512 F/BW/VL/VNNI (AMD Zen 4, Intel Ice Lake and later); every other VecOps entry
// is AVX2's. Both are exact integer sums, so they give AVX2's and the scalar loop's bits.
//
// scores_q8: a key row of D = 64 int8 codes is one 512-bit load; _mm512_dpbusd_epi32 multiplies it with a
// query row's 64 codes and leaves 16 partial sums, so 16 keys' vectors are reduced together by one
// unpack/shuffle tree (45 operations per 16 keys and row instead of 16 full horizontal sums). dpbusd takes
// one unsigned operand: the key codes are biased by 128 (xor 0x80, code + 128 in [1, 255]) and 128 * sum(q)
// is subtracted again.
// pv_q16: _mm512_dpwssd_epi32 on two keys' value codes interleaved as int16 pairs against the rows' int16
// weight pairs: 32 multiply-adds per instruction where fp32 FMAs on widened codes do 16 (and Zen 4 runs a
// 512-bit FMA as two 256-bit halves, so 512-bit fp32 measured no faster than AVX2's).
// Measured (one thread, 6144 keys x 3 rows from L2, D = 64): scores 16.5 us (AVX2 int16 madd 27 us; fp32
// FMAs on widened codes, before, ~35 us); P V 16.7 us (AVX2 int16 madd 29 us; fp32 before 36 us).
#include <immintrin.h>

#include <cstdint>

#include "../vec.h"
#include "cpu_features.h"
#include "int8_attention_loops.h"
#include "isa_x86.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
// GCC 12's 512-bit intrinsics pass _mm512_undefined_*() as the unused merge source and then warn about it
// (a known false positive); the vectors they build are fully defined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ortllm {
namespace vnni {
namespace {

// Four keys' [16] partial sums -> one vector whose 128-bit chunk c holds, in lane i, key i's sum over
// chunk c's four lanes.
inline __m512i fold4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

// Chunk sums of two vectors: [a0 + a1, a2 + a3, b0 + b1, b2 + b3] (128-bit chunks).
inline __m512i pair_chunks(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// R rows (R <= 3) x 16 keys per step; each key row is loaded (and biased) once for the R rows. D = 64 * ND
// (a compile-time D, so the accumulators stay in registers).
template <int R, int ND>
void scores_q8_rows(const int8_t* Qc, const float* qmul, const uint8_t* K, const uint16_t* scales, int nkeys, float* S,
                    int lds) {
  constexpr int D = 64 * ND;
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i corr[R];  // 128 * sum_d Qc[r][d]: what the bias added to every dot
  for (int r = 0; r < R; ++r) {
    __m512i sum = _mm512_setzero_si512();
    for (int d = 0; d < D; d += 64)
      sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512(Qc + static_cast<size_t>(r) * D + d));
    corr[r] = _mm512_set1_epi32(128 * _mm512_reduce_add_epi32(sum));
  }
  for (int j = 0; j < nkeys; j += 16) {
    const int nk = nkeys - j < 16 ? nkeys - j : 16;
    __m512i folded[R][4];
    for (int g = 0; g < 4; ++g) {
      __m512i acc[R][4];
      for (int c = 0; c < 4; ++c) {
        // past the last key (a tail): repeat it, so the loop has no branch; those lanes are never stored
        const int key = j + 4 * g + c < nkeys ? j + 4 * g + c : nkeys - 1;
        const uint8_t* k = K + static_cast<size_t>(key) * D;
        for (int r = 0; r < R; ++r) acc[r][c] = _mm512_setzero_si512();
        for (int d = 0; d < D; d += 64) {
          const __m512i kv = _mm512_xor_si512(_mm512_loadu_si512(k + d), bias);
          for (int r = 0; r < R; ++r)
            acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], kv, _mm512_loadu_si512(Qc + static_cast<size_t>(r) * D + d));
        }
      }
      for (int r = 0; r < R; ++r) folded[r][g] = fold4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    }
    const __mmask16 m = static_cast<__mmask16>((1u << nk) - 1u);
    const __m512 sc = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, scales + j));
    for (int r = 0; r < R; ++r) {
      const __m512i dots = _mm512_sub_epi32(
          pair_chunks(pair_chunks(folded[r][0], folded[r][1]), pair_chunks(folded[r][2], folded[r][3])), corr[r]);
      const __m512 s = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dots), _mm512_set1_ps(qmul[r])), sc);
      _mm512_mask_storeu_ps(S + static_cast<size_t>(r) * lds + j, m, s);
    }
  }
}

template <int ND>
void scores_q8_nd(const int8_t* Qc, const float* qmul, int rows, const uint8_t* K, const uint16_t* scales, int nkeys,
                  float* S, int lds) {
  for_row_triples(rows, [&](auto R, int r) {
    scores_q8_rows<R, ND>(Qc + static_cast<size_t>(r) * 64 * ND, qmul + r, K, scales, nkeys,
                          S + static_cast<size_t>(r) * lds, lds);
  });
}

void scores_q8(const int8_t* Qc, const float* qmul, int rows, const uint8_t* K, const uint16_t* scales, int nkeys,
               int D, float* S, int lds) {
  if (D == 64) return scores_q8_nd<1>(Qc, qmul, rows, K, scales, nkeys, S, lds);
  if (D == 128) return scores_q8_nd<2>(Qc, qmul, rows, K, scales, nkeys, S, lds);
  vec_avx2_ops()->scores_q8(Qc, qmul, rows, K, scales, nkeys, D, S, lds);
}

// R rows (R <= 3) x 64 dims per pass, two keys per step: 32 dims of each key interleaved byte by byte (in
// 128-bit lanes) and widened to int16 pairs, so one dpwssd gives 16 dims' w_j v_j + w_j+1 v_j+1 (exact). The
// lanes then hold dims [0..7, 16..23] and [8..15, 24..31] (and the same 32 higher): put back in order with
// shuffle_f32x4 before the fused multiply-add into O. D % 64 == 0.
template <int R>
void pv_q16_rows(const int16_t* W, int ldw, const float* wscale, const uint8_t* V, int nkeys, int D, float* O) {
  for (int h = 0; h < D; h += 64) {
    __m512i acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_si512();
    for (int j = 0; j < nkeys; j += 2) {
      const uint8_t* v = V + static_cast<size_t>(j) * D + h;
      const bool pair = j + 1 < nkeys;
      __m512i x[4];
      for (int half = 0; half < 2; ++half) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32 * half));
        const __m256i b =
            pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + D + 32 * half)) : _mm256_setzero_si256();
        x[2 * half] = _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(a, b));
        x[2 * half + 1] = _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(a, b));
      }
      for (int r = 0; r < R; ++r) {
        const __m512i wv = _mm512_set1_epi32(weight_pair(W + static_cast<size_t>(r) * ldw, j, nkeys));
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpwssd_epi32(acc[r][c], x[c], wv);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 ws = _mm512_set1_ps(wscale[r]);
      __m512 f[4];
      for (int c = 0; c < 4; ++c) f[c] = _mm512_cvtepi32_ps(acc[r][c]);
      const __m512 ordered[4] = {_mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(3, 2, 3, 2)),
                                 _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(3, 2, 3, 2))};
      float* o = O + static_cast<size_t>(r) * D + h;
      for (int c = 0; c < 4; ++c)
        _mm512_storeu_ps(o + 16 * c, _mm512_fmadd_ps(ordered[c], ws, _mm512_loadu_ps(o + 16 * c)));
    }
  }
}

void pv_q16(const int16_t* W, int ldw, const float* wscale, int rows, const uint8_t* V, int nkeys, int D, float* O) {
  if (D % 64 != 0) return vec_avx2_ops()->pv_q16(W, ldw, wscale, rows, V, nkeys, D, O);
  for_row_triples(rows, [&](auto R, int r) {
    pv_q16_rows<R>(W + static_cast<size_t>(r) * ldw, ldw, wscale + r, V, nkeys, D, O + static_cast<size_t>(r) * D);
  });
}

}  // namespace
}  // namespace vnni
}  // namespace ortllm

#pragma GCC pop_options

namespace ortllm {
// Compiled for the baseline ISA: checks the CPU and hands out the table (AVX2's, with these scores_q8 and pv_q16).
const VecOps* vec_vnni_ops() {
  static const VecOps* ops = []() -> const VecOps* {
    const VecOps* avx2 = vec_avx2_ops();
    if (avx2 == nullptr || !cpu_has_avx512_vnni()) return nullptr;
    static VecOps table = *avx2;
    table.name = "avx512vnni";
    table.scores_q8 = vnni::scores_q8;
    table.pv_q16 = vnni::pv_q16;
    return &table;
  }();
  return ops;
}
}  // namespace ortllm
#else
namespace ortllm {
const VecOps* vec_vnni_ops() {
  return nullptr;
}
}  // namespace ortllm
#endif
