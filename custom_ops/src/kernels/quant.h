// Per-row transforms applied to new tokens before they enter the KV cache: RoPE, the normalized
// fast Walsh-Hadamard transform, and symmetric 8-bit quantization (int8 and fp8 e4m3fn).
// Plain pointers and sizes only (no ORT types); see quant.cc for the why.
#pragma once
#include <cstdint>

namespace ortllm {

enum class KvDtype { kFloat32, kInt8, kFp8E4M3 };

// x: [D] rotated in place at one position. cos/sin: [D/2] rows of the rope cache.
// interleaved = false: HF rotate_half, pairs (i, i + D/2); true: pairs (2i, 2i + 1).
void apply_rope(float* x, int D, const float* cos, const float* sin, bool interleaved);

// x: [D], D a power of two. x <- H_D x / sqrt(D) (H_D Sylvester Hadamard; orthonormal, symmetric,
// its own inverse), so dot(fwht(q), fwht(k)) == dot(q, k) in exact arithmetic.
void fwht_normalized(float* x, int D);

// Symmetric per-row quantization of x: [D] -> codes: [D], returns the scale as IEEE fp16 bits
// (0 for an all-zero row). The scale is stored in fp16 (2 bytes per row instead of 4: 66 bytes per
// 64-dim row instead of 68), rounded up (vec.h f16_ceil), and the codes are computed with that
// stored scale s, so dequantization is exactly s * code and |x / s| never exceeds the code range.
// int8: s = f16_ceil(absmax / 127), code = round_half_even(x / s) in [-127, 127] (stored as a byte).
// e4m3: s = f16_ceil(absmax / 448), code = e4m3fn byte nearest to x / s (ties to even mantissa).
uint16_t quantize_int8(const float* x, int D, uint8_t* codes);
uint16_t quantize_e4m3(const float* x, int D, uint8_t* codes);
uint8_t float_to_e4m3(float v);  // |v| <= 448 expected; saturates at 448.

}  // namespace ortllm
