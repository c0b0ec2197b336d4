// QLinear driver (pure; the math, the layout and the invariance argument are in qlinear.h).
//
// Three phases per call:
//   1. each token's activations (RMSNorm'ed first when the op carries the norm) quantized once:
//      q [T, kb * bs] int8, dx / sx / zsum [T, kb];
//   2. the LoRA shrink h_j[t] = x[t] @ A_j[a] [rank] per (token, segment) with an adapter
//      (fp32 x, fp16 A, fp32 accumulation; tokens without an adapter cost nothing);
//   3. the projection over work items (8-row groups x token chunks): the group's weights are
//      unpacked once per kQTile tokens and stay in L1 across the chunk; each output's epilogue
//      (LoRA expand, residual or SiLU(gate) * up) runs right after its base value, in registers.
// Which item computes an output never changes its value (qlinear.h), so the split is free to
// follow the work: T = 1 splits the weight rows across the pool (each weight byte read once),
// prefill splits rows x token chunks. Small calls run on the calling thread.
#include "qlinear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "vec.h"

namespace ortllm {
namespace {

constexpr int64_t kTokenChunk = 64;             // tokens per work item (multiple of kQTile)
constexpr int64_t kQuantizeChunk = 16;          // tokens per activation-quantization item
constexpr int64_t kParallelBytes = 1 << 15;     // weight bytes x tokens below which one thread is faster
constexpr int64_t kParallelLoraMacs = 1 << 16;  // LoRA shrink multiply-adds worth waking the pool for
constexpr int64_t kPairTokens = 8;              // tokens of a work item from which group_dot2 pays (project)

struct Quad {
  int seg;
  int n;
  int64_t t[kQTile];  // tokens of one slot
};

struct Ctx {
  const QLinearDims* d;
  const QLinearArgs* a;
  const QLinearIsa* isa;
  int64_t kb, kpad, groups, out_groups, group_bytes;
  int64_t g_chunk, t_chunk, g_items;
  std::vector<int8_t> q;                      // [T, kpad]
  std::vector<float> dx, sx;                  // [T, kb]
  std::vector<int32_t> zsum;                  // [T, kb]
  std::vector<float> h[kQLinearMaxSegments];  // [T, r_max_j]
  std::vector<Quad> quads;                    // the LoRA shrink's work (plan_shrink)
  std::vector<float> normed;                  // [T, K] RMSNorm(x) * norm_weight, with a norm
  const float* xin = nullptr;                 // what the projection multiplies: x, or normed
};

// ---- phase 1: activations

// xn = x * 1 / sqrt(mean(x^2) + eps) * w. The sum of squares is in double over 8 interleaved partial sums
// (independent chains, not one latency-bound chain) combined in a fixed order: the same bits for a row
// whatever the batch.
void rms_norm_row(const float* x, int64_t K, const float* w, float eps, float* xn) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int i = 0; i < 8; ++i) part[i] += static_cast<double>(x[k + i]) * x[k + i];
  for (; k < K; ++k) part[k % 8] += static_cast<double>(x[k]) * x[k];
  const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(K) + eps));
  for (k = 0; k < K; ++k) xn[k] = (x[k] * inv) * w[k];
}

void quantize_tokens(Ctx& c, int64_t t0, int64_t t1) {
  const int zp = c.d->bits == 4 ? 8 : 0;
  const int64_t K = c.d->in_dim;
  for (int64_t t = t0; t < t1; ++t) {
    int32_t* qsum = c.zsum.data() + t * c.kb;
    float* dx = c.dx.data() + t * c.kb;
    if (c.a->norm_weight) rms_norm_row(c.a->x + t * K, K, c.a->norm_weight, c.a->norm_eps, c.normed.data() + t * K);
    c.isa->quantize_row(c.xin + t * K, static_cast<int>(K), static_cast<int>(c.d->block_size), c.q.data() + t * c.kpad,
                        dx, qsum);
    for (int64_t b = 0; b < c.kb; ++b) {
      c.sx[t * c.kb + b] = dx[b] * static_cast<float>(qsum[b]);
      qsum[b] *= zp;  // now zp * qsum
    }
  }
}

void quantize_item(void* usr, size_t i) {
  Ctx& c = *static_cast<Ctx*>(usr);
  const int64_t t0 = static_cast<int64_t>(i) * kQuantizeChunk;
  quantize_tokens(c, t0, std::min(c.d->num_tokens, t0 + kQuantizeChunk));
}

// ---- phase 2: LoRA shrink

int lora_rank(const Ctx& c, int64_t t, int j) {
  const QLinearArgs& a = *c.a;
  const int32_t s = a.token_adapter[t];
  if (s < 0 || a.lora_scale[s] == 0.f) return 0;
  return a.seg[j].rank[s];
}

// Up to kQTile tokens of one adapter on one segment: one pass over A[slot] for all of them.
void shrink_quad(void* usr, size_t i) {
  Ctx& c = *static_cast<Ctx*>(usr);
  const Quad& q = c.quads[i];
  const QLinearArgs& a = *c.a;
  const QLinearLoraSegment& sg = a.seg[q.seg];
  const int64_t K = c.d->in_dim, slot = a.token_adapter[q.t[0]];
  const int rank = sg.rank[slot];
  const float* x[kQTile];
  float* h[kQTile];
  for (int k = 0; k < q.n; ++k) {
    x[k] = c.xin + q.t[k] * K;
    h[k] = c.h[q.seg].data() + q.t[k] * sg.r_max;
  }
  c.isa->lora_shrink(x, q.n, static_cast<int>(K), sg.A + slot * K * sg.r_max,
                     a.packed_a ? rank : static_cast<int>(sg.r_max), rank, h);
}

// The shrink work: per segment, the tokens with an adapter on it, sorted by slot (counting sort), in
// groups of up to kQTile tokens of one slot. Returns the multiply-adds.
int64_t plan_shrink(Ctx& c) {
  const QLinearArgs& a = *c.a;
  const int64_t T = c.d->num_tokens;
  std::vector<int64_t> count(static_cast<size_t>(a.n_slots) + 1), order(static_cast<size_t>(T));
  int64_t macs = 0;
  for (int j = 0; j < a.n_segments; ++j) {
    c.h[j].assign(static_cast<size_t>(T * a.seg[j].r_max), 0.f);
    std::fill(count.begin(), count.end(), 0);
    for (int64_t t = 0; t < T; ++t)
      if (lora_rank(c, t, j) > 0) ++count[a.token_adapter[t] + 1];
    for (int64_t s = 0; s < a.n_slots; ++s) count[s + 1] += count[s];
    const int64_t n = count[a.n_slots];
    for (int64_t t = 0; t < T; ++t)
      if (lora_rank(c, t, j) > 0) order[count[a.token_adapter[t]]++] = t;  // count[s] ends at slot s's end
    for (int64_t i = 0; i < n;) {
      Quad q{j, 0, {}};
      const int32_t slot = a.token_adapter[order[i]];
      while (i < n && q.n < kQTile && a.token_adapter[order[i]] == slot) q.t[q.n++] = order[i++];
      c.quads.push_back(q);
      macs += q.n * lora_rank(c, q.t[0], j) * c.d->in_dim;
    }
  }
  return macs;
}

// ---- phase 3: projection + epilogue

// v[t * 8 .. + 8] (output columns c0..c0+7 of tokens ts..ts+nt-1) += each token's LoRA on those columns;
// tokens of one slot share each load of B.
void add_lora(const Ctx& c, int64_t ts, int nt, int64_t c0, float* v) {
  const QLinearArgs& a = *c.a;
  for (int j = 0; j < a.n_segments; ++j) {
    const QLinearLoraSegment& sg = a.seg[j];
    const int64_t lo = std::max(c0, sg.col0), hi = std::min(c0 + 8, sg.col0 + sg.width);
    if (lo >= hi) continue;
    bool done[kQTile] = {false, false, false, false};
    for (int i = 0; i < nt; ++i) {
      const int rank = done[i] ? 0 : lora_rank(c, ts + i, j);
      if (rank == 0) continue;
      const int64_t slot = a.token_adapter[ts + i];
      const float scale = a.lora_scale[slot];
      const uint16_t* B = sg.B + slot * sg.r_max * sg.width - sg.col0;  // B[r * width + (col - col0)]
      const float* h[kQTile];
      float* out[kQTile];
      int n = 0;
      for (int k = i; k < nt; ++k) {
        if (done[k] || a.token_adapter[ts + k] != slot) continue;
        done[k] = true;
        h[n] = c.h[j].data() + (ts + k) * sg.r_max;
        out[n++] = v + 8 * k;
      }
      if (lo == c0 && hi == c0 + 8) {
        c.isa->lora_expand8(h, n, rank, B + c0, sg.width, scale, out);
        continue;
      }
      for (int k = 0; k < n; ++k) {  // a group straddling two segments: the same fma chains, per column
        for (int64_t col = lo; col < hi; ++col) {
          float acc = 0.f;
          for (int r = 0; r < rank; ++r) acc = std::fma(h[k][r], f16_to_float(B[r * sg.width + col]), acc);
          out[k][col - c0] = std::fma(scale, acc, out[k][col - c0]);
        }
      }
    }
  }
}

// v[0:cols] = columns c0.. of token t's y, written to the split outputs they belong to.
void store_split(const QLinearArgs& a, int64_t t, int64_t c0, int cols, const float* v) {
  for (int j = 0; j < a.n_outputs; ++j) {
    const int64_t lo = std::max(c0, a.out_col0[j]), hi = std::min(c0 + cols, a.out_col0[j] + a.out_width[j]);
    float* out = a.outputs[j] + t * a.out_width[j] - a.out_col0[j];
    for (int64_t col = lo; col < hi; ++col) out[col] = v[col - c0];
  }
}

QGroup group(const Ctx& c, int64_t g) {
  const QLinearArgs& a = *c.a;
  const int64_t kb8 = c.kb * 8;
  return {a.codes + g * c.group_bytes,       a.d + g * kb8, a.m ? a.m + g * kb8 : nullptr, static_cast<int>(c.kb),
          static_cast<int>(c.d->block_size), c.d->bits};
}

// Group g's outputs (columns 8g..8g+7) for tokens ts..ts+nt-1 from their base values v [nt, 8] (and up
// [nt, 8], SwiGLU's up group): the LoRA, then the epilogue, stored.
__attribute__((always_inline)) inline void finish_group(const Ctx& c, int64_t g, int64_t ts, int nt, float* v,
                                                        float* up) {
  const QLinearDims& d = *c.d;
  const QLinearArgs& a = *c.a;
  const bool swiglu = d.epilogue == QLinearEpilogue::kSwiGLU;
  const int64_t N = d.out_dim, ycols = d.y_cols(), c0 = g * 8;
  if (a.token_adapter != nullptr && a.n_segments > 0) {
    add_lora(c, ts, nt, c0, v);
    if (swiglu) add_lora(c, ts, nt, (g + c.groups / 2) * 8, up);
  }
  alignas(32) float act[8];
  for (int i = 0; i < nt; ++i) {
    const int64_t t = ts + i;
    float* vi = v + 8 * i;
    if (a.n_outputs > 1) {  // split outputs: a.y is output 0 alone, [T, width_0], not [T, ycols]
      store_split(a, t, c0, static_cast<int>(std::min<int64_t>(8, N - c0)), vi);
      continue;
    }
    float* y = a.y + t * ycols + c0;
    if (swiglu) {
      c.isa->silu_mul8(vi, up + 8 * i, act);
      for (int r = 0; r < 8; ++r) y[r] = act[r];  // N / 2 is a multiple of 8 (checked by the wrapper)
      continue;
    }
    const int cols = static_cast<int>(std::min<int64_t>(8, N - c0));  // the last group may be padding
    if (d.epilogue == QLinearEpilogue::kResidual) {
      const float* res = a.residual + t * N + c0;
      for (int r = 0; r < cols; ++r) y[r] = res[r] + vi[r];
    } else {
      for (int r = 0; r < cols; ++r) y[r] = vi[r];
    }
  }
}

// Groups [g0, g1) x tokens [t0, t1): kQTile tokens at a time; with kPairTokens tokens or more, two groups per
// micro-kernel call where the ISA has group_dot2 (SwiGLU: the gate group with its up group; else neighbours).
// Fewer tokens keep the 8-row kernel: paired, a B = 1 step with 1 or 2 drafts (T = 2, 3) measured 1.25x / 1.16x
// slower and the int4 LM head at T = 1 up to 2x slower; from T = 8 on, pairing is faster (B = 16 decode 1.14x,
// prefill 1.12-1.18x, one thread). Either way each output gets the same bits (qlinear.h).
void project(const Ctx& c, int64_t g0, int64_t g1, int64_t t0, int64_t t1) {
  const bool swiglu = c.d->epilogue == QLinearEpilogue::kSwiGLU;
  const bool pair = c.isa->group_dot2 != nullptr && t1 - t0 >= kPairTokens;
  alignas(32) float base[2][kQTile * 8], up[kQTile * 8];
  for (int64_t g = g0; g < g1;) {
    const int n = !swiglu && pair && g + 1 < g1 ? 2 : 1;  // groups finished by this pass
    const QGroup wg = group(c, g);
    const QGroup w2 = swiglu ? group(c, g + c.groups / 2) : n == 2 ? group(c, g + 1) : wg;
    for (int64_t ts = t0; ts < t1; ts += kQTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kQTile, t1 - ts));
      const QTokens tok{c.q.data() + ts * c.kpad, c.kpad, c.dx.data() + ts * c.kb, c.zsum.data() + ts * c.kb,
                        c.sx.data() + ts * c.kb};
      if (pair && (swiglu || n == 2)) {
        c.isa->group_dot2(wg, w2, tok, nt, base[0], swiglu ? up : base[1]);
      } else {
        c.isa->group_dot(wg, tok, nt, base[0]);
        if (swiglu) c.isa->group_dot(w2, tok, nt, up);
      }
      for (int h = 0; h < n; ++h) finish_group(c, g + h, ts, nt, base[h], up);
    }
    g += n;
  }
}

void project_item(void* usr, size_t i) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  const int64_t gi = static_cast<int64_t>(i) % c.g_items, ti = static_cast<int64_t>(i) / c.g_items;
  const int64_t g0 = gi * c.g_chunk, t0 = ti * c.t_chunk;
  project(c, g0, std::min(c.out_groups, g0 + c.g_chunk), t0, std::min(c.d->num_tokens, t0 + c.t_chunk));
}

}  // namespace

void qlinear(const QLinearDims& d, const QLinearArgs& a, const Parallel& par) {
  const int64_t T = d.num_tokens;
  if (T == 0 || d.out_dim == 0) return;
  Ctx c{&d, &a, &qlinear_isa(), d.k_blocks(), 0, d.groups(), 0, 0, 0, 0, 0, {}, {}, {}, {}, {}, {}, {}, nullptr};
  c.kpad = c.kb * d.block_size;
  c.group_bytes = c.kb * d.block_size * d.bits;  // 8 rows x kb blocks x bs codes x bits / 8
  c.out_groups = d.epilogue == QLinearEpilogue::kSwiGLU ? c.groups / 2 : c.groups;
  const bool parallel = c.groups * c.group_bytes * T >= kParallelBytes;

  c.q.resize(static_cast<size_t>(T * c.kpad));
  c.dx.resize(static_cast<size_t>(T * c.kb));
  c.sx.resize(static_cast<size_t>(T * c.kb));
  c.zsum.resize(static_cast<size_t>(T * c.kb));
  if (a.norm_weight) c.normed.resize(static_cast<size_t>(T * d.in_dim));
  c.xin = a.norm_weight ? c.normed.data() : a.x;
  if (parallel && T > kQuantizeChunk) {
    par.run(static_cast<size_t>((T + kQuantizeChunk - 1) / kQuantizeChunk), quantize_item, &c);
  } else {
    quantize_tokens(c, 0, T);
  }

  if (a.token_adapter != nullptr && a.n_segments > 0) {
    const int64_t macs = plan_shrink(c);
    if (macs >= kParallelLoraMacs && c.quads.size() > 1) {
      par.run(c.quads.size(), shrink_quad, &c);
    } else {
      for (size_t i = 0; i < c.quads.size(); ++i) shrink_quad(&c, i);
    }
  }

  c.t_chunk = std::min(T, kTokenChunk);
  const int64_t t_items = (T + c.t_chunk - 1) / c.t_chunk;
  // about 16 items along the rows at decode, finer with more token chunks (prefill)
  c.g_chunk = std::max<int64_t>(1, std::min<int64_t>(32, c.out_groups / std::max<int64_t>(1, 16 / t_items)));
  if (t_items >= 16) c.g_chunk = std::max<int64_t>(1, std::min<int64_t>(c.g_chunk, 8));
  c.g_items = (c.out_groups + c.g_chunk - 1) / c.g_chunk;
  if (parallel) {
    par.run(static_cast<size_t>(c.g_items * t_items), project_item, &c);
  } else {
    project(c, 0, c.out_groups, 0, T);
  }
}

}  // namespace ortllm
