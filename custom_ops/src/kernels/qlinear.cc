// QLinear driver (pure; the math, the layout and the invariance argument are in qlinear.h).
//
// Three phases per call:
//   1. each token's activations quantized once: q [T, kb * bs] int8, dx / sx / zsum [T, kb];
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

constexpr int64_t kTokenChunk = 64;        // tokens per work item (multiple of kQTile)
constexpr int64_t kQuantizeChunk = 16;     // tokens per activation-quantization item
constexpr int64_t kParallelBytes = 1 << 15;  // weight bytes x tokens below which one thread is faster

struct Ctx {
  const QLinearDims* d;
  const QLinearArgs* a;
  const QLinearIsa* isa;
  int64_t kb, kpad, groups, out_groups, group_bytes;
  int64_t g_chunk, t_chunk, g_items;
  std::vector<int8_t> q;       // [T, kpad]
  std::vector<float> dx, sx;   // [T, kb]
  std::vector<int32_t> zsum;   // [T, kb]
  std::vector<float> h[kQLinearMaxSegments];  // [T, r_max_j]
};

// ---- phase 1: activations

void quantize_tokens(Ctx& c, int64_t t0, int64_t t1) {
  const int zp = c.d->bits == 4 ? 8 : 0;
  for (int64_t t = t0; t < t1; ++t) {
    int32_t* qsum = c.zsum.data() + t * c.kb;
    float* dx = c.dx.data() + t * c.kb;
    c.isa->quantize_row(c.a->x + t * c.d->in_dim, static_cast<int>(c.d->in_dim),
                        static_cast<int>(c.d->block_size), c.q.data() + t * c.kpad, dx, qsum);
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

void shrink_token(Ctx& c, int64_t t) {
  const QLinearArgs& a = *c.a;
  const int64_t K = c.d->in_dim;
  for (int j = 0; j < a.n_segments; ++j) {
    const int rank = lora_rank(c, t, j);
    if (rank == 0) continue;
    const QLinearLoraSegment& sg = a.seg[j];
    const int64_t slot = a.token_adapter[t];
    c.isa->lora_shrink(a.x + t * K, static_cast<int>(K), sg.A + slot * K * sg.r_max,
                       a.packed_a ? rank : static_cast<int>(sg.r_max), rank, c.h[j].data() + t * sg.r_max);
  }
}

void shrink_item(void* usr, size_t i) { shrink_token(*static_cast<Ctx*>(usr), static_cast<int64_t>(i)); }

// ---- phase 3: projection + epilogue

// v[0:8] (output columns c0..c0+7 of token t) += the token's LoRA on those columns.
void add_lora(const Ctx& c, int64_t t, int64_t c0, float* v) {
  const QLinearArgs& a = *c.a;
  for (int j = 0; j < a.n_segments; ++j) {
    const QLinearLoraSegment& sg = a.seg[j];
    const int64_t lo = std::max(c0, sg.col0), hi = std::min(c0 + 8, sg.col0 + sg.width);
    if (lo >= hi) continue;
    const int rank = lora_rank(c, t, j);
    if (rank == 0) continue;
    const int64_t slot = a.token_adapter[t];
    const float scale = a.lora_scale[slot];
    const float* h = c.h[j].data() + t * sg.r_max;
    const uint16_t* B = sg.B + slot * sg.r_max * sg.width - sg.col0;  // B[r * width + (col - col0)]
    if (lo == c0 && hi == c0 + 8) {
      c.isa->lora_expand8(h, rank, B + c0, sg.width, scale, v);
      continue;
    }
    for (int64_t col = lo; col < hi; ++col) {  // a group straddling two segments: the same fma chain
      float acc = 0.f;
      for (int r = 0; r < rank; ++r) acc = std::fma(h[r], f16_to_float(B[r * sg.width + col]), acc);
      v[col - c0] = std::fma(scale, acc, v[col - c0]);
    }
  }
}

QGroup group(const Ctx& c, int64_t g) {
  const QLinearArgs& a = *c.a;
  const int64_t kb8 = c.kb * 8;
  return {a.codes + g * c.group_bytes, a.d + g * kb8, a.m ? a.m + g * kb8 : nullptr, static_cast<int>(c.kb),
          static_cast<int>(c.d->block_size), c.d->bits};
}

void project(const Ctx& c, int64_t g0, int64_t g1, int64_t t0, int64_t t1) {
  const QLinearDims& d = *c.d;
  const QLinearArgs& a = *c.a;
  const bool lora = a.token_adapter != nullptr && a.n_segments > 0;
  const bool swiglu = d.epilogue == QLinearEpilogue::kSwiGLU;
  const int64_t N = d.out_dim, ycols = d.y_cols(), up_offset = c.groups / 2;
  alignas(32) float base[kQTile * 8], up[kQTile * 8], act[8];
  for (int64_t g = g0; g < g1; ++g) {
    const QGroup wg = group(c, g);
    const QGroup wu = swiglu ? group(c, g + up_offset) : wg;
    const int64_t c0 = g * 8, cu = (g + up_offset) * 8;
    for (int64_t ts = t0; ts < t1; ts += kQTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kQTile, t1 - ts));
      const QTokens tok{c.q.data() + ts * c.kpad, c.kpad, c.dx.data() + ts * c.kb, c.zsum.data() + ts * c.kb,
                        c.sx.data() + ts * c.kb};
      c.isa->group_dot(wg, tok, nt, base);
      if (swiglu) c.isa->group_dot(wu, tok, nt, up);
      for (int i = 0; i < nt; ++i) {
        const int64_t t = ts + i;
        float* v = base + 8 * i;
        if (lora) add_lora(c, t, c0, v);
        float* y = a.y + t * ycols + c0;
        if (swiglu) {
          if (lora) add_lora(c, t, cu, up + 8 * i);
          c.isa->silu_mul8(v, up + 8 * i, act);
          for (int r = 0; r < 8; ++r) y[r] = act[r];  // N / 2 is a multiple of 8 (checked by the wrapper)
          continue;
        }
        const int cols = static_cast<int>(std::min<int64_t>(8, N - c0));  // the last group may be padding
        if (d.epilogue == QLinearEpilogue::kResidual) {
          const float* res = a.residual + t * N + c0;
          for (int r = 0; r < cols; ++r) y[r] = res[r] + v[r];
        } else {
          for (int r = 0; r < cols; ++r) y[r] = v[r];
        }
      }
    }
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
  Ctx c{&d, &a, &qlinear_isa(), d.k_blocks(), 0, d.groups(), 0, 0, 0, 0, 0, {}, {}, {}, {}, {}};
  c.kpad = c.kb * d.block_size;
  c.group_bytes = c.kb * d.block_size * d.bits;  // 8 rows x kb blocks x bs codes x bits / 8
  c.out_groups = d.epilogue == QLinearEpilogue::kSwiGLU ? c.groups / 2 : c.groups;
  const bool parallel = c.groups * c.group_bytes * T >= kParallelBytes;

  c.q.resize(static_cast<size_t>(T * c.kpad));
  c.dx.resize(static_cast<size_t>(T * c.kb));
  c.sx.resize(static_cast<size_t>(T * c.kb));
  c.zsum.resize(static_cast<size_t>(T * c.kb));
  if (parallel && T > kQuantizeChunk) {
    par.run(static_cast<size_t>((T + kQuantizeChunk - 1) / kQuantizeChunk), quantize_item, &c);
  } else {
    quantize_tokens(c, 0, T);
  }

  if (a.token_adapter != nullptr && a.n_segments > 0) {
    int64_t macs = 0;
    for (int j = 0; j < a.n_segments; ++j) {
      c.h[j].assign(static_cast<size_t>(T * a.seg[j].r_max), 0.f);
      for (int64_t t = 0; t < T; ++t) macs += lora_rank(c, t, j) * d.in_dim;
    }
    if (macs > (1 << 20)) {
      par.run(static_cast<size_t>(T), shrink_item, &c);
    } else if (macs > 0) {
      for (int64_t t = 0; t < T; ++t) shrink_token(c, t);
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
