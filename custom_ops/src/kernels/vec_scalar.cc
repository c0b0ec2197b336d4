// Portable scalar versions of the VecOps table (see vec.h). Straightforward loops that the
// compiler may auto-vectorize with the baseline ISA (SSE2); they are also the fallback on CPUs
// without AVX2/FMA/F16C. Shapes as documented in vec.h.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "vec.h"

namespace ortllm {

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24);  // zero and subnormals
  } else if (exp == 31) {
    mag = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    uint32_t bits = ((exp + 112u) << 23) | (man << 13);
    std::memcpy(&mag, &bits, sizeof mag);
  }
  uint32_t out;
  std::memcpy(&out, &mag, sizeof out);
  out |= sign;
  std::memcpy(&mag, &out, sizeof mag);
  return mag;
}

uint16_t f16_ceil(float v) {
  if (!(v > 0.f)) return 0;
  if (!(v <= 65504.f)) return 0x7BFF;  // largest finite fp16 (also for +inf)
  // Truncate to fp16 (toward zero), then step up one ulp if that lost anything: positive fp16
  // bit patterns are ordered like their values, so +1 is the next representable value.
  uint16_t h;
  if (v < 6.103515625e-05f) {                      // below 2^-14: subnormal grid 2^-24
    h = static_cast<uint16_t>(std::ldexp(v, 24));  // floor of v / 2^-24 (v > 0)
  } else {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    h = static_cast<uint16_t>((((bits >> 23) - 112u) << 10) | ((bits >> 13) & 0x3FFu));
  }
  if (f16_to_float(h) < v) ++h;
  return h;
}

float e4m3_to_float(uint8_t code) {
  // e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf; 0x7f/0xff are NaN (never written).
  const int exp = (code >> 3) & 0xF;
  const int man = code & 0x7;
  float mag =
      exp == 0 ? std::ldexp(static_cast<float>(man), -9) : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return (code & 0x80) ? -mag : mag;
}

namespace {

inline float elem(const float* p, int i) {
  return p[i];
}
inline float elem(const uint16_t* p, int i) {
  return f16_to_float(p[i]);
}

// KT: fp32 keys, or fp16 ones (an fp16 cache's) read in place: the same float operations either way.
template <class KT>
void scores_t(const float* Q, int rows, const KT* K, int nkeys, int D, float alpha, float* S, int lds) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < nkeys; ++j) {
      float acc = 0.f;
      for (int d = 0; d < D; ++d) acc += Q[r * D + d] * elem(K, j * D + d);
      S[r * lds + j] = alpha * acc;
    }
  }
}

template <class VT>
void pv_t(const float* P, int ldp, int rows, const VT* V, int nkeys, int D, float* O) {
  for (int r = 0; r < rows; ++r) {
    float* o = O + r * D;
    for (int j = 0; j < nkeys; ++j) {
      const float p = P[r * ldp + j];
      if (p == 0.f) continue;
      for (int d = 0; d < D; ++d) o[d] += p * elem(V, j * D + d);
    }
  }
}

void scores(const float* Q, int rows, const float* K, int nkeys, int D, float alpha, float* S, int lds) {
  scores_t(Q, rows, K, nkeys, D, alpha, S, lds);
}
void scores_f16(const float* Q, int rows, const uint16_t* K, int nkeys, int D, float alpha, float* S, int lds) {
  scores_t(Q, rows, K, nkeys, D, alpha, S, lds);
}
void pv(const float* P, int ldp, int rows, const float* V, int nkeys, int D, float* O) {
  pv_t(P, ldp, rows, V, nkeys, D, O);
}
void pv_f16(const float* P, int ldp, int rows, const uint16_t* V, int nkeys, int D, float* O) {
  pv_t(P, ldp, rows, V, nkeys, D, O);
}

void widen_e4m3(const uint8_t* codes, int nrows, int D, float* out) {
  static float lut[256];
  static bool ready = [] {
    for (int c = 0; c < 256; ++c) lut[c] = e4m3_to_float(static_cast<uint8_t>(c));
    return true;
  }();
  (void)ready;
  for (int j = 0; j < nrows * D; ++j) out[j] = lut[codes[j]];
}

void scale_columns(float* S, int rows, int lds, const uint16_t* scales, int n) {
  for (int j = 0; j < n; ++j) {
    const float sj = f16_to_float(scales[j]);
    for (int r = 0; r < rows; ++r) S[r * lds + j] *= sj;
  }
}

void scores_q8(const int8_t* Qc, const float* qmul, int rows, const uint8_t* K, const uint16_t* scales, int nkeys,
               int D, float* S, int lds) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < nkeys; ++j) {
      int32_t acc = 0;
      for (int d = 0; d < D; ++d) acc += int32_t{Qc[r * D + d]} * int32_t{static_cast<int8_t>(K[j * D + d])};
      S[r * lds + j] = (static_cast<float>(acc) * qmul[r]) * f16_to_float(scales[j]);
    }
  }
}

void pv_q16(const int16_t* W, int ldw, const float* wscale, int rows, const uint8_t* V, int nkeys, int D, float* O) {
  for (int r = 0; r < rows; ++r) {
    for (int d = 0; d < D; ++d) {
      int32_t acc = 0;
      for (int j = 0; j < nkeys; ++j) acc += int32_t{W[r * ldw + j]} * int32_t{static_cast<int8_t>(V[j * D + d])};
      O[r * D + d] = std::fma(static_cast<float>(acc), wscale[r], O[r * D + d]);  // as the SIMD tables
    }
  }
}

float weights_q16(const float* w, int n, int16_t* codes) {
  float mx = 0.f;
  for (int i = 0; i < n; ++i) mx = w[i] > mx ? w[i] : mx;
  if (!(mx > 0.f)) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0.f;
  }
  const float inv = 32767.f / mx;
  for (int i = 0; i < n; ++i) codes[i] = static_cast<int16_t>(std::nearbyint(w[i] * inv));
  return mx / 32767.f;
}

float exp_sum(float* x, int n, float m) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  return s;
}

float vmax(const float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

int vargmax(const float* x, int n) {
  int k = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[k]) k = i;
  return k;
}

void scal(float* y, int n, float a) {
  for (int i = 0; i < n; ++i) y[i] *= a;
}

void gemm_rows(int M, int N, int K, float alpha, const float* const* A, const float* B, int ldb, float* const* C) {
  for (int m = 0; m < M; ++m) {
    float* c = C[m];
    for (int k = 0; k < K; ++k) {
      const float a = alpha * A[m][k];
      const float* b = B + static_cast<size_t>(k) * ldb;
      for (int n = 0; n < N; ++n) c[n] += a * b[n];
    }
  }
}

// Each row segment of B is widened once into `b` and used by all M rows (f16_to_float is not cheap).
void gemm_rows_f16b(int M, int N, int K, float alpha, const float* const* A, const uint16_t* B, int ldb,
                    float* const* C) {
  constexpr int kCols = 256;
  float b[kCols];
  for (int n0 = 0; n0 < N; n0 += kCols) {
    const int nc = N - n0 < kCols ? N - n0 : kCols;
    for (int k = 0; k < K; ++k) {
      const uint16_t* bk = B + static_cast<size_t>(k) * ldb + n0;
      for (int n = 0; n < nc; ++n) b[n] = f16_to_float(bk[n]);
      for (int m = 0; m < M; ++m) {
        const float a = alpha * A[m][k];
        float* c = C[m] + n0;
        for (int n = 0; n < nc; ++n) c[n] += a * b[n];
      }
    }
  }
}

void fwht(float* x, int D) {
  for (int h = 1; h < D; h *= 2) {
    for (int i = 0; i < D; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(D));
  for (int i = 0; i < D; ++i) x[i] *= norm;
}

void unpack_q4(const uint8_t* packed, int nrows, int D, uint8_t* codes) {
  const int half = D / 2;
  for (int j = 0; j < nrows; ++j, packed += half, codes += D) {
    for (int i = 0; i < half; ++i) {
      codes[i] = static_cast<uint8_t>((packed[i] & 15) - 8);
      codes[i + half] = static_cast<uint8_t>((packed[i] >> 4) - 8);
    }
  }
}

void quantize_i8_codes(const float* x, int D, float scale, uint8_t* codes) {
  // Round half to even via the 1.5 * 2^23 trick (exact for |v| < 2^22 under the default rounding
  // mode; here |v| <= 127 once clamped): same result as nearbyint/np.rint, without a libm call per element.
  constexpr float kMagic = 12582912.0f;
  for (int i = 0; i < D; ++i) {
    float q = (x[i] / scale + kMagic) - kMagic;  // no -ffast-math: not reassociated away
    q = q > 127.f ? 127.f : (q < -127.f ? -127.f : q);
    if (q != q) q = 0.f;  // NaN input: write 0 rather than an undefined conversion
    codes[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

void widen_f16(const uint16_t* h, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = f16_to_float(h[i]);
}

float absmax(const float* x, int n) {
  float m = 0.f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    m = a > m ? a : m;  // (std::fmax is a libm call without -ffinite-math-only); a NaN keeps m
  }
  return m;
}

}  // namespace

const VecOps& vec_scalar_ops() {
  static const VecOps ops = [] {
    VecOps t{};
    t.name = "scalar";
    t.scores = scores;
    t.pv = pv;
    t.widen_e4m3 = widen_e4m3;
    t.unpack_q4 = unpack_q4;
    t.scale_columns = scale_columns;
    t.scores_q8 = scores_q8;
    t.pv_q16 = pv_q16;
    t.weights_q16 = weights_q16;
    t.exp_sum = exp_sum;
    t.max = vmax;
    t.absmax = absmax;
    t.argmax = vargmax;
    t.scal = scal;
    t.gemm_rows = gemm_rows;
    t.gemm_rows_f16b = gemm_rows_f16b;
    t.fwht = fwht;
    t.quantize_i8_codes = quantize_i8_codes;
    t.widen_f16 = widen_f16;
    t.scores_f16 = scores_f16;
    t.pv_f16 = pv_f16;
    return t;
  }();
  return ops;
}

}  // namespace ortllm
