// RoPE, Hadamard rotation and 8-bit quantization for the rows written into the KV cache.
//
// What: per (token, kv head) row of D floats: rope -> (quantized caches) normalized FWHT -> symmetric
// quantization with one fp16 scale per row (rounded up; the codes use the stored scale).
// Why this way: these run once per new token and head (O(T * H * D log D)), off the long-context hot
// path (the attention reads every cached row per step); but a decode step at short context is a few
// microseconds of attention, of which the 12 Hadamard transforms and 6 quantizations of a SmolLM2 token
// were a quarter, so those two inner loops are VecOps entries (AVX2: the same operations, same bits). The
// Hadamard transform spreads the few outlier channels of llama keys over all D channels, so the
// per-row absmax (hence the quantization step) shrinks; because H/sqrt(D) is orthonormal the
// same rotation on Q leaves q.k unchanged. Rounding: int8 rounds half to even (nearbyint under
// the default rounding mode), e4m3 rounds to the nearest representable value, ties to even
// mantissa, saturating at +-448 (e4m3fn has no infinities).
#include "quant.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "vec.h"

namespace ortllm {

void apply_rope(float* x, int D, const float* cos, const float* sin, bool interleaved) {
  const int half = D / 2;
  if (interleaved) {
    for (int i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * cos[i] - b * sin[i];
      x[2 * i + 1] = b * cos[i] + a * sin[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cos[i] - b * sin[i];
      x[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

void fwht_normalized(const VecOps& v, float* x, int D) {
  v.fwht(x, D);
}

uint16_t quantize_int8(const VecOps& v, const float* x, int D, uint8_t* codes) {
  const float amax = v.absmax(x, D);
  if (!(amax > 0.f)) {
    for (int i = 0; i < D; ++i) codes[i] = 0;
    return 0;
  }
  const uint16_t s16 = f16_ceil(amax / 127.0f);
  v.quantize_i8_codes(x, D, f16_to_float(s16), codes);  // round half to even, clamp to +-127
  return s16;
}

uint16_t quantize_int4(const VecOps& v, const float* x, int D, uint8_t* packed) {
  const float amax = v.absmax(x, D);
  const int half = D / 2;
  if (!(amax > 0.f)) {
    for (int i = 0; i < half; ++i) packed[i] = 0x88;  // code 0 in both nibbles
    return 0;
  }
  const uint16_t s16 = f16_ceil(amax / 7.0f);
  // |x / s| <= 7 with the rounded-up scale, so the int8 codes are the int4 codes (NaN: 0).
  thread_local std::vector<uint8_t> codes;
  codes.resize(static_cast<size_t>(D));
  v.quantize_i8_codes(x, D, f16_to_float(s16), codes.data());
  for (int i = 0; i < half; ++i) {
    const int lo = static_cast<int8_t>(codes[i]) + 8, hi = static_cast<int8_t>(codes[i + half]) + 8;
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return s16;
}

static uint8_t e4m3_magnitude(float a) {  // a >= 0 and not NaN
  if (a >= 448.f) return 0x7E;
  if (a < 0.015625f) {  // below 2^-6: subnormal grid m * 2^-9, m in 0..8 (8 = smallest normal)
    return static_cast<uint8_t>(std::nearbyint(a * 512.f));
  }
  // Normal range: round the fp32 mantissa to 3 bits, nearest-even, on the bit pattern (a carry
  // into the exponent is the correct result), then re-bias the exponent from 127 to 7.
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof bits);
  bits += 0x7FFFFu + ((bits >> 20) & 1u);
  const uint32_t exp = (bits >> 23) - 120u;  // e4m3 biased exponent, >= 1 here
  const uint32_t man = (bits >> 20) & 7u;
  if (exp > 15 || (exp == 15 && man > 6)) return 0x7E;
  return static_cast<uint8_t>((exp << 3) | man);
}

uint8_t float_to_e4m3(float v) {
  const float a = std::fabs(v);
  // NaN in: saturate rather than write a NaN code into the cache. A zero magnitude is +0 (0x00).
  const uint8_t mag = (a == a) ? e4m3_magnitude(a) : 0x7E;
  return mag == 0 ? 0 : static_cast<uint8_t>((std::signbit(v) ? 0x80 : 0x00) | mag);
}

uint16_t quantize_e4m3(const VecOps& v, const float* x, int D, uint8_t* codes) {
  const float amax = v.absmax(x, D);
  const uint16_t s16 = amax > 0.f ? f16_ceil(amax / 448.0f) : 0;
  const float scale = f16_to_float(s16);
  for (int i = 0; i < D; ++i) codes[i] = s16 != 0 ? float_to_e4m3(x[i] / scale) : 0;
  return s16;
}

}  // namespace ortllm

namespace ortllm {

// Round to nearest even on the bit pattern, as vcvtps2ph does: normals keep 10 mantissa bits (a carry into the
// exponent is the correct result, up to inf past 65504); below 2^-14 the value goes to the subnormal grid 2^-24 by
// nearbyint (the default rounding mode: ties to even), which is exact in fp32 for these magnitudes.
static uint16_t float_to_f16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));  // NaN, quiet
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504 (or inf): inf
  if (abs < 0x38800000u) {                                               // below 2^-14: subnormal or zero
    float a;
    std::memcpy(&a, &abs, sizeof a);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.f)));
  }
  const uint32_t r = abs + 0xFFFu + ((abs >> 13) & 1u);  // nearest even at bit 13
  return static_cast<uint16_t>(sign | (((r >> 23) - 112u) << 10 | ((r >> 13) & 0x3FFu)));
}

void round_f16(const float* x, int D, uint16_t* h) {
  for (int i = 0; i < D; ++i) h[i] = float_to_f16(x[i]);
}

}  // namespace ortllm
