// Portable QLinear micro-kernels (the contract is in qlinear.h). Every float operation is the one
// the AVX2 path performs lane by lane (std::fma where it uses an FMA, the same order), so both
// paths give the same bits; only silu_mul8's exp differs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "qlinear.h"
#include "vec.h"

namespace ortllm {
namespace {

// Codes of kMax levels a side (int8: 127, int16: 32767), dx = absmax / kMax, rounded half to even; |x * (1 / dx)|
// never rounds past kMax (it is within a few ulps of kMax at the absmax).
template <class Code, int kMax>
void quantize_codes(const float* x, int K, int bs, Code* q, float* dx, int32_t* qsum) {
  const int kb = (K + bs - 1) / bs;
  for (int b = 0; b < kb; ++b) {
    const int k0 = b * bs, k1 = std::min(K, k0 + bs);
    float amax = 0.f;
    for (int k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float d = amax / static_cast<float>(kMax);
    const float id = d != 0.f ? 1.f / d : 0.f;
    int32_t s = 0;
    for (int k = k0; k < k0 + bs; ++k) {
      const int v = k < k1 ? static_cast<int>(std::nearbyint(x[k] * id)) : 0;
      q[k] = static_cast<Code>(v);
      s += v;
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

// Code of element e (0..31) of row r in one packed sub-block (layout in qlinear.h).
inline int code4(const uint8_t* sub, int r, int e) {
  const int j = e / 8, i = e % 8;
  const uint8_t byte = sub[32 * j + 4 * r + (i & 3)];
  return i < 4 ? (byte & 0x0F) : (byte >> 4);
}
inline int code8(const uint8_t* sub, int r, int e) {
  return static_cast<int8_t>(sub[32 * (e / 4) + 4 * r + (e % 4)]);
}

// The value the integer dot multiplies element e of row r by: an affine code (int4 0..15, int8 signed), or an mxfp4
// code's table value biased by kMxfp4Zero (0..24; the driver's zsum takes 12 qsum off).
inline int weight_code(const QGroup& g, const uint8_t* sub, int r, int e) {
  if (g.bits == 8) return code8(sub, r, e);
  const int c = code4(sub, r, e);
  return g.mxfp4 ? kMxfp4Table[c] + kMxfp4Zero : c;
}

// Also the table's group_dot_mxfp4 (weight_code reads either kind of group).
void group_dot(const QGroup& g, const QTokens& x, int nt, float* out) {
  const int sub_blocks = g.bs / 32, sub_bytes = 32 * g.bits;  // 32 elements x 8 rows x bits / 8
  for (int t = 0; t < nt; ++t) {
    const int8_t* q = x.q + t * x.q_stride;
    float acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = out[t * 8 + r];  // 0 or the LoRA term (qlinear.h)
    for (int b = 0; b < g.kb; ++b) {
      const float dxb = x.dx[t * g.kb + b];
      for (int r = 0; r < 8; ++r) {
        int32_t isum = 0;
        for (int s = 0; s < sub_blocks; ++s) {
          const uint8_t* sub = g.codes + (static_cast<int64_t>(b) * sub_blocks + s) * sub_bytes;
          const int8_t* qs = q + b * g.bs + 32 * s;
          for (int e = 0; e < 32; ++e) isum += weight_code(g, sub, r, e) * qs[e];
        }
        isum -= x.zsum[t * g.kb + b];
        acc[r] = std::fma(f16_to_float(g.d[b * 8 + r]) * dxb, static_cast<float>(isum), acc[r]);
        if (g.m) acc[r] = std::fma(f16_to_float(g.m[b * 8 + r]), x.sx[t * g.kb + b], acc[r]);
      }
    }
    for (int r = 0; r < 8; ++r) out[t * 8 + r] = acc[r];
  }
}

// int8 weights on int16 activation codes (act_bits 16): group_dot's operations with x.q16.
void group_dot16(const QGroup& g, const QTokens& x, int nt, float* out) {
  const int sub_blocks = g.bs / 32;
  for (int t = 0; t < nt; ++t) {
    const int16_t* q = x.q16 + t * x.q_stride;
    float acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = out[t * 8 + r];
    for (int b = 0; b < g.kb; ++b) {
      const float dxb = x.dx[t * g.kb + b];
      for (int r = 0; r < 8; ++r) {
        int32_t isum = 0;
        for (int s = 0; s < sub_blocks; ++s) {
          const uint8_t* sub = g.codes + (static_cast<int64_t>(b) * sub_blocks + s) * 256;
          const int16_t* qs = q + b * g.bs + 32 * s;
          for (int e = 0; e < 32; ++e) isum += code8(sub, r, e) * qs[e];
        }
        isum -= x.zsum[t * g.kb + b];
        acc[r] = std::fma(f16_to_float(g.d[b * 8 + r]) * dxb, static_cast<float>(isum), acc[r]);
        if (g.m) acc[r] = std::fma(f16_to_float(g.m[b * 8 + r]), x.sx[t * g.kb + b], acc[r]);
      }
    }
    for (int r = 0; r < 8; ++r) out[t * 8 + r] = acc[r];
  }
}

void lora_shrink(const QLoraToken* x, int n, int K, int bs, const QLoraShrink* s, int ns) {
  const int kc = (K + kLoraChunk - 1) / kLoraChunk;
  for (int j = 0; j < ns; ++j) {
    const int lda = s[j].lda;
    for (int t = 0; t < n; ++t) {
      for (int r = 0; r < s[j].rank; ++r) {
        float acc = 0.f;
        for (int c = 0; c < kc; ++c) {
          int32_t isum = 0;
          for (int k = c * kLoraChunk; k < std::min(K, (c + 1) * kLoraChunk); ++k)
            isum += x[t].q[k] * s[j].A[(static_cast<int64_t>(k / 4) * lda + r) * 4 + k % 4];
          const float dsa = x[t].dx[c * kLoraChunk / bs] * f16_to_float(s[j].sA[static_cast<int64_t>(c) * lda + r]);
          acc = std::fma(dsa, static_cast<float>(isum), acc);
        }
        s[j].h[t][r] = acc;
      }
    }
  }
}

void lora_expand(const int8_t* const* qh, const float* coef, int n, int quads, const int8_t* B, int64_t width,
                 const uint16_t* sB, float* const* out, int64_t ostride) {
  for (int t = 0; t < n; ++t) {
    for (int64_t i = 0; i < width; ++i) {
      int32_t isum = 0;
      for (int r = 0; r < 4 * quads; ++r) isum += qh[t][r] * B[(r / 4 * width + i) * 4 + r % 4];
      out[t][i / 8 * ostride + i % 8] = (coef[t] * f16_to_float(sB[i])) * static_cast<float>(isum);
    }
  }
}

float sigmoid(float s) {
  const float e = std::exp(-std::fabs(s));
  return s >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

void silu_mul8(const float* g, const float* u, float* out) {
  for (int i = 0; i < 8; ++i) out[i] = g[i] * sigmoid(g[i]) * u[i];
}

void gelu_mul8(const float* g, const float* u, float* out) {
  for (int i = 0; i < 8; ++i) {
    const float s = g[i] * (kGeluA + kGeluB * (g[i] * g[i]));  // 2 z
    out[i] = g[i] * sigmoid(s) * u[i];
  }
}

void mul8(const float* v, const float* g, float* out) {
  for (int r = 0; r < 8; ++r) out[r] = v[r] * g[r];
}

void rms_norm_row(const float* x, int K, const float* w, float eps, float* xn) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int k = 0; k < K; ++k) part[k % 8] += static_cast<double>(x[k]) * x[k];
  const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(K) + eps));
  for (int k = 0; k < K; ++k) xn[k] = (x[k] * inv) * w[k];
}

}  // namespace

const QLinearIsa& qlinear_scalar_isa() {
  static const QLinearIsa isa = [] {
    QLinearIsa t{};
    t.name = "scalar";
    t.quantize_row = quantize_row;
    t.group_dot = group_dot;
    t.group_dot2 = nullptr;  // the driver calls group_dot twice
    t.lora_shrink = lora_shrink;
    t.lora_expand = lora_expand;
    t.silu_mul8 = silu_mul8;
    t.gelu_mul8 = gelu_mul8;
    t.rms_norm_row = rms_norm_row;
    t.quantize_row16 = quantize_row16;
    t.group_dot16 = group_dot16;
    t.mul8 = mul8;
    t.group_dot_mxfp4 = group_dot;
    return t;
  }();
  return isa;
}

}  // namespace ortllm
