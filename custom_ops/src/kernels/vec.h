// Vector primitives shared by the kernels, with run-time ISA dispatch.
//
// What: the few dense inner loops the ops spend their time in (row-block dot products, P@V
// accumulation, 8-bit codes as floats, exp-and-sum for the softmax, a small strided GEMM).
// Why this way: the library must run on any CPU, so nothing is compiled with -mavx2 globally.
// x86/vec_avx2.cc compiles its bodies under `#pragma GCC target("avx2,fma")`; vec_scalar.cc is the
// portable fallback. A session's row of the ISA registry (isa.h) names the table its kernels call. Each entry
// works on a whole block (not one element or one row) so the indirect call is amortized.
// Plain pointers and sizes only: no ORT types here.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ortllm {

struct VecOps {
  const char* name;
  // S[r * lds + j] = alpha * dot(Q[r * D ..], K[j * D ..]) for r < rows, j < nkeys.
  // Q: [rows, D], K: [nkeys, D] (row-major, contiguous rows), S: [rows, lds].
  void (*scores)(const float* Q, int rows, const float* K, int nkeys, int D, float alpha, float* S, int lds);
  // O[r * D ..] += sum_j P[r * ldp + j] * V[j * D ..]. P: [rows, ldp], V: [nkeys, D], O: [rows, D].
  void (*pv)(const float* P, int ldp, int rows, const float* V, int nkeys, int D, float* O);
  // fp8 e4m3fn cache rows as floats, unscaled: out[j * D + d] = code(j, d) exactly. The rows' fp16 scales are
  // applied to the scores and to the probabilities instead (scale_columns): once per (query row, key) rather
  // than once per code. (int8 caches never widen: their dots are integer, scores_q8 and pv_q16.)
  void (*widen_e4m3)(const uint8_t* codes, int nrows, int D, float* out);
  // int4 cache rows as int8 codes: codes[j * D + d] = the int8 byte of code(j, d) in [-7, 7], from packed
  // [nrows, D / 2] (quant.h quantize_int4: nibble = code + 8, low nibbles the first half of a row). The int8
  // dots then read them as an int8 cache's codes (scores_q8, pv_q16): a block at a time into L1, so the
  // cache streams half the bytes of int8 from memory.
  void (*unpack_q4)(const uint8_t* packed, int nrows, int D, uint8_t* codes);
  // S[r * lds + j] *= scale_j (IEEE fp16 bits) for r < rows, j < n.
  void (*scale_columns)(float* S, int rows, int lds, const uint16_t* scales, int n);
  // int8 keys against int8 queries: S[r * lds + j] = (float(sum_d Qc[r * D + d] * code(j, d)) * qmul[r]) * scale_j,
  // where Qc holds a query row's int8 codes (quant.h quantize_int8 of the roped, rotated row) and qmul[r] is
  // alpha times that row's scale. The integer dot is exact, so every table, every number of rows and every
  // tail gives the same bits; |dot| <= D * 127 * 127 is exact in a float for D <= 1024.
  void (*scores_q8)(const int8_t* Qc, const float* qmul, int rows, const uint8_t* K, const uint16_t* scales, int nkeys,
                    int D, float* S, int lds);
  // int8 values with 16-bit weights: O[r * D + d] = fma(float(sum_j W[r * ldw + j] * code(j, d)), wscale[r], O[..])
  // (an exact integer sum, then one fused multiply-add per output: the same bits on every table). W: [rows, ldw]
  // int16 codes of one row's weights P * scale_j (weights_q16), V: [nkeys, D] int8 codes.
  void (*pv_q16)(const int16_t* W, int ldw, const float* wscale, int rows, const uint8_t* V, int nkeys, int D,
                 float* O);
  // codes[i] = round_half_even(w[i] * (32767 / max_i w[i])) for w[i] >= 0; returns max / 32767 (0 and all codes 0
  // when the max is 0), so w[i] ~ codes[i] * the returned scale within half a step.
  float (*weights_q16)(const float* w, int n, int16_t* codes);
  // x[i] = exp(x[i] - m); returns sum_i x[i].
  float (*exp_sum)(float* x, int n, float m);
  // max_i x[i], n >= 1.
  float (*max)(const float* x, int n);
  // max_i |x[i]| (0 for n = 0; NaNs are skipped): a row's step before it is quantized into a cache (quant.h). A
  // maximum does not depend on the order it is taken in: every table gives the same value.
  float (*absmax)(const float* x, int n);
  // The first i with x[i] = max_j x[j] (numpy's argmax), n >= 1; every table gives the same i (NaNs: any i).
  int (*argmax)(const float* x, int n);
  // y[i] *= a.
  void (*scal)(float* y, int n, float a);
  // C[i][0:N] += alpha * sum_k A[i][k] * B[k * ldb + 0:N] for i < M. Rows of A and C are given
  // as pointer arrays, so the LoRA kernel works on scattered token rows without gathering them.
  void (*gemm_rows)(int M, int N, int K, float alpha, const float* const* A, const float* B, int ldb, float* const* C);
  // The same with B in IEEE fp16 (bits), widened to fp32 as it is read; fp32 accumulation. For the
  // tables streamed from memory once per call, where their bytes are the cost: the LoRA slot stacks
  // (kernels/multi_lora.h) and the block-offsets term (kernels/block_offsets.h).
  void (*gemm_rows_f16b)(int M, int N, int K, float alpha, const float* const* A, const uint16_t* B, int ldb,
                         float* const* C);
  // x <- H_D x / sqrt(D) (normalized fast Walsh-Hadamard, D a power of two): the butterflies of stride 1,
  // 2, 4, ... in that order, then one multiply; every table does exactly these operations (same bits).
  void (*fwht)(float* x, int D);
  // codes[i] = int8 byte of clamp(round_half_even(x[i] / scale), -127, 127), 0 for NaN (quant.h
  // quantize_int8's loop); every table does exactly these operations (same bits).
  void (*quantize_i8_codes)(const float* x, int D, float scale, uint8_t* codes);
  // out[i] = the float of IEEE fp16 bits h[i], i < n (exact: F16C's vcvtph2ps or f16_to_float, the same bits).
  // fp16 caches' rows into an L1 scratch, a (block, kv head) at a time, before the fp32 scores and P V of a tile
  // with many query rows (prefill), which then reads each widened row many times.
  void (*widen_f16)(const uint16_t* h, int n, float* out);
  // scores and pv with K / V given as IEEE fp16 bits (an fp16 cache's rows), widened as the dot loops read them.
  // For D % 8 == 0, the bits of widen_f16 then scores / pv on every table (the widening is exact; the fp32
  // operations and their order are the same); other D agree within rounding only (scores' and pv's scalar tails
  // are rounded as the compiler vectorizes them). For tiles of few query rows (decode: G per kv head), where a
  // scratch pass would be a second pass over each block for three reads of it.
  void (*scores_f16)(const float* Q, int rows, const uint16_t* K, int nkeys, int D, float alpha, float* S, int lds);
  void (*pv_f16)(const float* P, int ldp, int rows, const uint16_t* V, int nkeys, int D, float* O);
};

const VecOps& vec_scalar_ops();  // the portable table; the others are the architecture's (isa.h)

// fp8 e4m3fn byte -> float (exact). Shared by both paths and the quantizer.
float e4m3_to_float(uint8_t code);

// IEEE fp16 bits -> float (exact, subnormals and inf/nan included).
float f16_to_float(uint16_t h);

// Positive finite float -> the fp16 bits of the smallest fp16 >= it (rounded up, so a scale never
// shrinks: codes computed with it stay in range). Saturates at the largest finite fp16 (65504);
// a positive value below the smallest subnormal gives that subnormal (never 0).
uint16_t f16_ceil(float v);

}  // namespace ortllm
