// MoE driver (pure; the math and the invariance argument are in moe.h). Per chunk of up to kTokenChunk tokens:
//   1. the chunk's (token, j) terms grouped by expert: start[e] .. start[e + 1] are expert e's positions, its terms
//      in token order (order[pos] = the term t * k + j, pos_of[term] = its position);
//   2. each expert with terms: its tokens' rows of x gathered into xg [pos, H], then gate|up (SwiGLU) into
//      h [pos, I] and down into out [pos, H] (expert_ffn: the kernel's only QLinear calls);
//   3. y[t] = sum_j w[t, j] * out[pos_of[t * k + j]], in j order.
#include "moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "isa.h"
#include "qlinear.h"

namespace ortllm {
namespace {

// Tokens a pass: bounds the buffers at kTokenChunk * k * (2H + I) floats (Qwen3-30B-A3B, top-8: 80 MB at 256), while
// a prefill's experts still see ~kTokenChunk * k / E tokens a sweep of their rows.
constexpr int64_t kTokenChunk = 256;
// An expert with this many terms runs alone with the pool inside its QLinear calls (QLinear splits N and the tokens);
// experts with fewer run side by side, one thread each (a decode step's experts: 1 to B tokens each).
constexpr int64_t kWideTerms = 32;

// A call's buffers, kept per calling thread from call to call (sizes only grow), as QLinear keeps its own.
struct Scratch {
  std::vector<int64_t> start, order, pos_of, narrow;
  std::vector<float> xg, h, out, gu;  // gu: [terms, 2I] gate|up before its bias and activation (when unfused)
};

Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

// Whether gate|up's QLinear epilogue computes the activation (plain SwiGLU, no biases) or moe.cc does (unfused).
bool fused_act(const MoeDims& d, const MoeArgs& a) {
  return d.activation == MoeActivation::kSwiGLU && a.gate_up_bias == nullptr;
}

// h [n, I] <- act(gu + bias) row by row, gu [n, 2I] gate columns then up (bias: [2I] or nullptr). Plain float32,
// no contraction across the statements: each output is the same bits for a row whatever else is in the call.
void activate(const MoeDims& d, const float* gu, const float* bias, int64_t n, float* h) {
  const int64_t I = d.inter;
  for (int64_t r = 0; r < n; ++r) {
    const float* g_row = gu + r * 2 * I;
    float* out = h + r * I;
    for (int64_t i = 0; i < I; ++i) {
      float g = g_row[i], u = g_row[I + i];
      if (bias) {
        g += bias[i];
        u += bias[I + i];
      }
      if (d.activation == MoeActivation::kClampedSwiGLU) {
        g = std::min(g, d.limit);
        u = std::clamp(u, -d.limit, d.limit);
        const float ag = d.alpha * g;
        const float glu = g / (1.f + std::exp(-ag));
        out[i] = (u + 1.f) * glu;
      } else {
        const float silu = g / (1.f + std::exp(-g));
        out[i] = silu * u;
      }
    }
  }
}

// The one place the kernel calls QLinear: expert e's FFN on its n gathered rows xg [n, H] -> h [n, I] -> out [n, H]
// (gu [n, 2I]: gate|up's output when the activation is not its epilogue).
void expert_ffn(const MoeDims& d, const MoeArgs& a, int64_t e, int64_t n, const float* xg, float* h, float* gu,
                float* out, const Parallel& par, const OpsIsa& isa) {
  const bool fused = fused_act(d, a);
  QLinearDims gud{
      n, d.hidden, 2 * d.inter, d.block_size, d.bits, fused ? QLinearEpilogue::kSwiGLU : QLinearEpilogue::kNone};
  QLinearDims dn{n, d.inter, d.hidden, d.block_size, d.bits, QLinearEpilogue::kNone};
  gud.mxfp4 = dn.mxfp4 = d.mxfp4;
  auto run = [&](const QLinearDims& dims, const MoeWeights& w, const float* x, float* y) {
    const int64_t scale_n = dims.groups() * dims.k_blocks() * 8;  // one expert's fp16 scales (and offsets)
    const int64_t code_n = dims.groups() * dims.k_blocks() * dims.block_size * dims.bits;  // and code bytes
    QLinearArgs q{};
    q.x = x;
    q.codes = w.codes + e * code_n;
    q.d = w.d + e * scale_n;
    q.m = w.m ? w.m + e * scale_n : nullptr;
    q.y = y;
    q.n_outputs = 1;
    qlinear(dims, q, par, isa);
  };
  if (fused) {
    run(gud, a.gate_up, xg, h);
  } else {
    run(gud, a.gate_up, xg, gu);
    activate(d, gu, a.gate_up_bias ? a.gate_up_bias + e * 2 * d.inter : nullptr, n, h);
  }
  run(dn, a.down, h, out);
  if (a.down_bias) {
    const float* b = a.down_bias + e * d.hidden;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < d.hidden; ++i) out[r * d.hidden + i] += b[i];
  }
}

struct Ctx {
  const MoeDims* d;
  const MoeArgs* a;
  int64_t t0;  // the chunk's first token
  const int64_t* start;
  const int64_t* order;
  const int64_t* narrow;  // experts run side by side
  float *xg, *h, *out, *gu;
  const OpsIsa* isa;  // the session's kernel path
};

// Expert e on its positions [start[e], start[e + 1]): gather, then its FFN.
void run_expert(const Ctx& c, int64_t e, const Parallel& par) {
  const int64_t H = c.d->hidden, k = c.d->top_k, p0 = c.start[e], n = c.start[e + 1] - p0;
  for (int64_t p = p0; p < p0 + n; ++p)
    std::memcpy(c.xg + p * H, c.a->x + (c.t0 + c.order[p] / k) * H, sizeof(float) * static_cast<size_t>(H));
  float* gu = c.gu ? c.gu + p0 * 2 * c.d->inter : nullptr;
  expert_ffn(*c.d, *c.a, e, n, c.xg + p0 * H, c.h + p0 * c.d->inter, gu, c.out + p0 * H, par, *c.isa);
}

void narrow_item(void* usr, size_t i) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  run_expert(c, c.narrow[i], Parallel{});
}

void run_chunk(const MoeDims& d, const MoeArgs& a, int64_t t0, int64_t nt, Scratch& s, const Parallel& par,
               const OpsIsa& isa) {
  const int64_t E = d.n_experts, k = d.top_k, H = d.hidden, terms = nt * k;
  const int64_t* ids = a.expert + t0 * k;
  s.start.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < terms; ++i) ++s.start[static_cast<size_t>(ids[i] + 1)];
  for (int64_t e = 0; e < E; ++e) s.start[e + 1] += s.start[e];
  s.order.resize(static_cast<size_t>(terms));
  s.pos_of.resize(static_cast<size_t>(terms));
  {
    std::vector<int64_t>& next = s.narrow;  // borrowed as each expert's fill cursor
    next.assign(s.start.begin(), s.start.end() - 1);
    for (int64_t i = 0; i < terms; ++i) {
      const int64_t p = next[ids[i]]++;
      s.order[p] = i;
      s.pos_of[i] = p;
    }
  }
  s.xg.resize(static_cast<size_t>(terms * H));
  s.h.resize(static_cast<size_t>(terms * d.inter));
  s.out.resize(static_cast<size_t>(terms * H));
  const bool fused = fused_act(d, a);
  if (!fused) s.gu.resize(static_cast<size_t>(terms * 2 * d.inter));
  s.narrow.clear();
  Ctx c{&d,      &a,          t0,         s.start.data(), s.order.data(),
        nullptr, s.xg.data(), s.h.data(), s.out.data(),   fused ? nullptr : s.gu.data(),
        &isa};
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = s.start[e + 1] - s.start[e];
    if (n >= kWideTerms)
      run_expert(c, e, par);
    else if (n > 0)
      s.narrow.push_back(e);
  }
  c.narrow = s.narrow.data();
  if (s.narrow.size() == 1)
    run_expert(c, s.narrow[0], par);
  else if (!s.narrow.empty())
    par.run(s.narrow.size(), narrow_item, &c);

  for (int64_t t = 0; t < nt; ++t) {
    float* y = a.y + (t0 + t) * H;
    const float* w = a.weight + (t0 + t) * k;
    const float* r0 = s.out.data() + s.pos_of[t * k] * H;
    for (int64_t i = 0; i < H; ++i) y[i] = w[0] * r0[i];
    for (int64_t j = 1; j < k; ++j) {
      const float* r = s.out.data() + s.pos_of[t * k + j] * H;
      for (int64_t i = 0; i < H; ++i) y[i] += w[j] * r[i];
    }
  }
}

// Buffers a long prefill grew past kKeepBytes are given back after the call (as QLinear's).
constexpr size_t kKeepBytes = size_t{4} << 20;
template <class V>
void trim(V& v) {
  if (v.capacity() * sizeof(typename V::value_type) > kKeepBytes) V().swap(v);
}

}  // namespace

void moe(const MoeDims& d, const MoeArgs& a, const Parallel& par, const OpsIsa& isa) {
  if (d.num_tokens == 0) return;
  Scratch& s = thread_scratch();
  for (int64_t t0 = 0; t0 < d.num_tokens; t0 += kTokenChunk)
    run_chunk(d, a, t0, std::min(kTokenChunk, d.num_tokens - t0), s, par, isa);
  trim(s.xg), trim(s.h), trim(s.out), trim(s.gu), trim(s.order), trim(s.pos_of);
}

}  // namespace ortllm
