// AVX-512 VNNI version of PagedAttention's integer q . k (scores_q8), picked at run time where the CPU has
// AVX-512 F/BW/VL/VNNI (AMD Zen 4, Intel Ice Lake and later); every other VecOps entry is AVX2's.
//
// scores_q8: a key row of D = 64 int8 codes is one 512-bit load; _mm512_dpbusd_epi32 multiplies it with a
// query row's 64 codes and leaves 16 partial sums, so 16 keys' vectors are reduced together by one
// unpack/shuffle tree (45 operations per 16 keys and row instead of 16 full horizontal sums). dpbusd takes
// one unsigned operand: the key codes are biased by 128 (xor 0x80, code + 128 in [1, 255]) and 128 * sum(q)
// is subtracted again. The dot is an exact integer, so the bits are AVX2's and the scalar loop's.
// Measured (one thread, 6144 keys x 3 rows from L2): 17.8 us against AVX2's int16 madd 54 us and the
// earlier fp32 FMAs on widened codes ~35 us. pv_i8 on 512-bit vectors measured the same as AVX2's (33.5 vs
// 34.5 us: Zen 4 runs a 512-bit FMA as two 256-bit halves), so it stays AVX2's.
#include <immintrin.h>

#include <cstdint>

#include "cpu_features.h"
#include "row_triples.h"
#include "vec.h"

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

}  // namespace
}  // namespace vnni
}  // namespace ortllm

#pragma GCC pop_options

namespace ortllm {
// Compiled for the baseline ISA: checks the CPU and hands out the table (AVX2's, with this scores_q8).
const VecOps* vec_vnni_ops() {
  static const VecOps* ops = []() -> const VecOps* {
    const VecOps* avx2 = vec_avx2_ops();
    if (avx2 == nullptr || !cpu_has_avx512_vnni()) return nullptr;
    static VecOps table = *avx2;
    table.name = "avx512vnni";
    table.scores_q8 = vnni::scores_q8;
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
