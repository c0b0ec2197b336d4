// Per-row transforms applied to new tokens before they enter the KV cache: RoPE, the normalized
// fast Walsh-Hadamard transform, symmetric quantization (int8, fp8 e4m3fn, int4) and fp16 rounding.
// Plain pointers and sizes only (no ORT types); see quant.cc for the why.
#pragma once
#include <cstdint>

namespace ortllm {

struct VecOps;

// kFloat16: IEEE half values, no scales (the fp32 cache at half the bytes); the others are codes with an fp16 scale
// per row.
enum class KvDtype { kFloat32, kInt8, kFp8E4M3, kInt4, kFloat16 };

// Codes with an fp16 scale per row (key_scales / value_scales used): int8, fp8, int4.
inline bool kv_has_scales(KvDtype t) {
  return t != KvDtype::kFloat32 && t != KvDtype::kFloat16;
}

// Bytes of one cached row of D elements (the last extent of the caches): fp32 4 D, fp16 2 D, int8 / fp8 D,
// int4 D / 2.
inline int64_t kv_row_bytes(KvDtype t, int64_t D) {
  switch (t) {
    case KvDtype::kFloat32:
      return 4 * D;
    case KvDtype::kFloat16:
      return 2 * D;
    case KvDtype::kInt4:
      return D / 2;
    default:
      return D;
  }
}

// x: [D] rotated in place at one position. cos/sin: [D/2] rows of the rope cache.
// interleaved = false: HF rotate_half, pairs (i, i + D/2); true: pairs (2i, 2i + 1).
void apply_rope(float* x, int D, const float* cos, const float* sin, bool interleaved);

// x: [D], D a power of two. x <- H_D x / sqrt(D) (H_D Sylvester Hadamard; orthonormal, symmetric,
// its own inverse), so dot(fwht(q), fwht(k)) == dot(q, k) in exact arithmetic.
// v: the session's table (isa.h), whose fwht every table computes with the same operations.
void fwht_normalized(const VecOps& v, float* x, int D);

// Symmetric per-row quantization of x: [D] -> codes: [D], returns the scale as IEEE fp16 bits
// (0 for an all-zero row). The scale is stored in fp16 (2 bytes per row instead of 4: 66 bytes per
// 64-dim row instead of 68), rounded up (vec.h f16_ceil), and the codes are computed with that
// stored scale s, so dequantization is exactly s * code and |x / s| never exceeds the code range.
// int8: s = f16_ceil(absmax / 127), code = round_half_even(x / s) in [-127, 127] (stored as a byte).
// e4m3: s = f16_ceil(absmax / 448), code = e4m3fn byte nearest to x / s (ties to even mantissa).
uint16_t quantize_int8(const VecOps& v, const float* x, int D, uint8_t* codes);
// int4 (D even): s = f16_ceil(absmax / 7), c = round_half_even(x / s) in [-7, 7], stored biased (c + 8 in 1..15)
// two to a byte: packed[i] = (c[i] + 8) | (c[i + D/2] + 8) << 4 for i < D / 2 (the low nibbles are the first
// half of the row, the high nibbles the second: one 4-bit shift unpacks a whole half, vec.h unpack_q4).
uint16_t quantize_int4(const VecOps& v, const float* x, int D, uint8_t* packed);
uint16_t quantize_e4m3(const VecOps& v, const float* x, int D, uint8_t* codes);
uint8_t float_to_e4m3(float v);  // |v| <= 448 expected; saturates at 448.
// x: [D] -> IEEE fp16 bits, each rounded to nearest even (as F16C's vcvtps2ph with _MM_FROUND_TO_NEAREST_INT);
// beyond 65504 gives inf, NaN stays NaN.
void round_f16(const float* x, int D, uint16_t* h);

}  // namespace ortllm
