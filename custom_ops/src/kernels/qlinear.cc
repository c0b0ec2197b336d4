// QLinear driver (pure; the math, the layout and the invariance argument are in qlinear.h).
//
// Three phases per call:
//   1. each token's activations (RMSNorm'ed first when the op carries the norm) quantized once:
//      q [T, kb * bs] int8, dx / sx / zsum [T, kb];
//   2. the LoRA per up to kQTile tokens of one slot: the shrink h_j = x @ A_j[a] of every segment j where the
//      slot has a rank (q, k and v in one pass) as integer dots of phase 1's codes with the int8 A, each h_j
//      quantized to int8, the expand h_j @ B_j[a] as integer dots into lora [G, T, 8] (tokens without an
//      adapter cost nothing);
//   3. the projection over work items (8-row groups x token chunks): the group's weights are
//      unpacked once per kQTile tokens and stay in L1 across the chunk; the accumulators start from
//      lora (0 without), and each output's epilogue (residual, or SiLU / GELU-tanh(gate) * up) runs right after;
//      with an argmax output, each item's first maximum per token, merged in column order after.
//      DoRA rows are multiplied by their slot's per-output scale first (plan_dora: one [N] row per DoRA slot).
// Which item computes an output never changes its value (qlinear.h), so the split is free to
// follow the work: T = 1 splits the weight rows across the pool (each weight byte read once),
// prefill splits rows x token chunks. Small calls run on the calling thread.
#include "qlinear.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "isa.h"
#include "vec.h"

namespace ortllm {
namespace {

constexpr int64_t kTokenChunk = 64;     // tokens per work item (multiple of kQTile)
constexpr int64_t kQuantizeChunk = 16;  // tokens per activation-quantization item (at most)
// From this many tokens (a decode step of B >= 8) the quantization is split in two items over the pool, at most
// kQuantizeChunk tokens each: on the calling thread alone it was ~6% of a B = 16 decode loop's CPU samples while
// the other thread spun; split, B = 16 decode ran 2.8-4.7% faster (3 rounds alternating). Below it, one thread.
constexpr int64_t kQuantizeSplit = 8;
constexpr int64_t kParallelBytes = 1 << 15;     // weight bytes x tokens below which one thread is faster
constexpr int64_t kParallelLoraMacs = 1 << 18;  // LoRA multiply-adds (integer) worth waking the pool for
constexpr int64_t kPairTokens = 8;              // tokens of a work item from which group_dot2 pays (project)

// The LoRA's unit of work: up to kQTile terms of one slot, on every segment where the slot has a rank. A term is
// (token t, k-th adapter of its mix), numbered e = t * M + k (M = adapter_terms; e = t without mixes).
struct Quad {
  int n_segs;
  int segs[kQLinearMaxSegments];
  int n;
  int64_t t[kQTile];  // terms of one slot
};

// A call's buffers, kept per calling thread from call to call (the session's thread lives as long as the session):
// a decode step makes ~120 QLinear calls, and allocating and freeing these on each was ~3% of a B = 1 step's CPU
// samples (perf, malloc / free / consolidate). Sizes only grow; every user writes before it reads, except where a
// call zero-fills (lora, qh).
struct Scratch {
  std::vector<int8_t> q, qt;
  std::vector<int16_t> q16;
  std::vector<uint8_t> q16_lo;
  std::vector<int8_t> q16_hi;
  std::vector<float> dx, sx, normed, lora, best, dora_rows, dxt, sxt;
  std::vector<float> dx8;  // act_bits 16 with a LoRA: the int8 codes' scales, which the LoRA's shrink reads
  std::vector<int32_t> zsum, qsum32, qst, hi_sum;
  std::vector<float> h[kQLinearMaxSegments];
  std::vector<int8_t> qh[kQLinearMaxSegments];
  std::vector<Quad> quads;
  std::vector<int64_t> best_at;
  std::vector<const float*> row_scale;
  std::vector<uint8_t> mix_mask;
};

Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

// After a call: buffers a large prefill grew past kKeepBytes are given back, so a thread does not hold a long
// prompt's LoRA buffer ([G, T, 8] floats: TinyLlama's gate|up at 2048 tokens is 92 MB) between calls.
constexpr size_t kKeepBytes = size_t{4} << 20;
template <class V>
void trim(V& v) {
  if (v.capacity() * sizeof(typename V::value_type) > kKeepBytes) V().swap(v);
}
void trim(Scratch& s) {
  trim(s.q), trim(s.qt), trim(s.q16), trim(s.q16_lo), trim(s.q16_hi), trim(s.dx), trim(s.sx), trim(s.normed),
      trim(s.lora), trim(s.best), trim(s.best_at), trim(s.zsum), trim(s.qsum32), trim(s.dora_rows), trim(s.dxt),
      trim(s.sxt), trim(s.qst), trim(s.hi_sum), trim(s.dx8), trim(s.mix_mask);
  for (int j = 0; j < kQLinearMaxSegments; ++j) trim(s.h[j]), trim(s.qh[j]);
}

struct Ctx {
  explicit Ctx(Scratch& s)
      : q(s.q),
        qt(s.qt),
        dxt(s.dxt),
        sxt(s.sxt),
        qst(s.qst),
        q16(s.q16),
        q16_lo(s.q16_lo),
        q16_hi(s.q16_hi),
        hi_sum(s.hi_sum),
        dx(s.dx),
        dx8(s.dx8),
        sx(s.sx),
        zsum(s.zsum),
        qsum32(s.qsum32),
        h(s.h),
        qh(s.qh),
        lora(s.lora),
        mix_mask(s.mix_mask),
        quads(s.quads),
        normed(s.normed),
        best(s.best),
        best_at(s.best_at),
        dora_rows(s.dora_rows),
        row_scale(s.row_scale) {
    quads.clear();
  }
  const QLinearDims* d = nullptr;
  const QLinearArgs* a = nullptr;
  const QLinearIsa* isa = nullptr;
  int64_t kb = 0, kpad = 0, groups = 0, out_groups = 0, group_bytes = 0;
  int64_t g_chunk = 0, t_chunk = 0, g_items = 0;
  int64_t q_chunk = 0;           // tokens per quantization item
  std::vector<int8_t>& q;        // [T, kpad]
  std::vector<int8_t>& qt;       // [ceil(T / kCodeTile), kb, kCodeTile, bs] q by tiles, with `tiled` (QTokens::q_tiles)
  std::vector<float>&dxt, &sxt;  // [ceil(T / kCodeTile), kb, kCodeTile] dx, sx by tiles, with `tiled`
  std::vector<int32_t>& qst;     // the same of the codes' sums, with `tiled` and int8 weights (QTokens::qsum_tiles)
  bool tiled = false;
  std::vector<int16_t>& q16;     // [T, kpad] instead, with act_bits 16
  std::vector<uint8_t>& q16_lo;  // [T, kpad] with split16 (QTokens::q16_lo)
  std::vector<int8_t>& q16_hi;
  std::vector<int32_t>& hi_sum;  // [T, kb] with split16: each block's sum of q16_hi (QTokens::q16_hi_sum)
  bool split16 = false;
  std::vector<float>&dx, &dx8, &sx;                // [T, kb]; dx8: the int8 codes' dx beside int16 ones (LoRA)
  std::vector<int32_t>& zsum;                      // [T, kb]
  int64_t kc = 0;                                  // 32-chunks of K (the LoRA's A scales)
  bool lora_sums = false;                          // qsum32 is wanted (a token has a LoRA here)
  std::vector<int32_t>& qsum32;                    // [T, kc] sums of the codes per chunk, with a LoRA
  std::vector<float> (&h)[kQLinearMaxSegments];    // [T * M, r_max_j], a row per term
  std::vector<int8_t> (&qh)[kQLinearMaxSegments];  // [T * M, r_max_j] h's int8 codes (0 past the rank)
  // [G, T, 8] each token's LoRA on the output columns (0 where it has none), group-major so that a tile's values
  // are one run; the projection's micro-kernels start their accumulation from it and leave the outputs there.
  // With mixes, layers [M, G, T, 8]: term k expands into layer k, and a row's terms are added into layer 0 (by
  // the projection's items just before they read it, or by merge_terms first when a segment is off the 8-column grid).
  std::vector<float>& lora;
  int64_t terms = 1;   // M: terms per token (adapter_terms)
  int64_t layers = 1;  // layers of lora: M when a token of the call mixes, else 1
  // [T, kQLinearMaxSegments] with mixes on the grid: bit k set where term k of the token has a rank on the segment
  std::vector<uint8_t>& mix_mask;
  bool merge_in_project = false;  // the projection's items add the terms (mix_mask) of the groups they compute
  float* lbuf = nullptr;          // lora.data(), or nullptr without a LoRA
  std::vector<Quad>& quads;       // the LoRA's work (plan_lora)
  std::vector<float>& normed;     // [T, K] RMSNorm(x) * norm_weight, with a norm
  const float* xin = nullptr;     // what the projection multiplies: x, or normed
  std::vector<float>& best;       // [T, g_items] with an argmax output: each item's maximum per token
  std::vector<int64_t>& best_at;  // [T, g_items] its first column
  // DoRA: one row [G * 8] per DoRA slot of the call (its scale on the columns of segments where it has a rank,
  // 1 elsewhere and on the padding), and per token its row or nullptr (no DoRA: the epilogue multiplies nothing)
  std::vector<float>& dora_rows;
  std::vector<const float*>& row_scale;
  const float* const* scale_of = nullptr;  // row_scale.data() when a token of the call is a DoRA row
  const VecOps* vec = nullptr;             // the session's attention/LoRA table (argmax)
};

// ---- phase 1: activations

// q [T, kpad] -> qt by tiles of kCodeTile tokens (QTokens::q_tiles): tile i's block b, row t at
// ((i * kb + b) * kCodeTile + t) * bs; dx, sx -> dxt, sxt at (i * kb + b) * kCodeTile + t, and with int8 weights each
// block's code sum into qst there (zsum holds zp * qsum, 0 for them). The rows past T in the last tile are left as
// they are (never read). size_tiles first (on the calling thread), then tile_tokens by each quantization item on its
// own tokens (a token's row goes to its own slots: the items never write the same bytes).
void size_tiles(Ctx& c) {
  const int64_t tiles = (c.d->num_tokens + kCodeTile - 1) / kCodeTile;
  c.qt.resize(static_cast<size_t>(tiles * kCodeTile * c.kpad));
  c.dxt.resize(static_cast<size_t>(tiles * kCodeTile * c.kb));
  c.sxt.resize(static_cast<size_t>(tiles * kCodeTile * c.kb));
  if (c.d->bits == 8) c.qst.resize(static_cast<size_t>(tiles * kCodeTile * c.kb));
}

void tile_tokens(Ctx& c, int64_t t0, int64_t t1) {
  const int64_t bs = c.d->block_size;
  const bool sums = c.d->bits == 8;
  for (int64_t t = t0; t < t1; ++t) {
    const int8_t* row = c.q.data() + t * c.kpad;
    const int64_t i = t / kCodeTile, r = t % kCodeTile;
    int8_t* tile = c.qt.data() + i * kCodeTile * c.kpad + r * bs;
    for (int64_t b = 0; b < c.kb; ++b) {
      const size_t at = static_cast<size_t>((i * c.kb + b) * kCodeTile + r);
      std::copy_n(row + b * bs, bs, tile + b * kCodeTile * bs);
      c.dxt[at] = c.dx[static_cast<size_t>(t * c.kb + b)];
      c.sxt[at] = c.sx[static_cast<size_t>(t * c.kb + b)];
      if (sums) c.qst[at] = std::accumulate(row + b * bs, row + (b + 1) * bs, 0);
    }
  }
}

// act_bits 16's codes of tokens [t0, t1) as bytes for group_dot2_16 (QTokens::q16_lo / q16_hi): q = 256 * hi + lo
// exactly, and each block's sum of the high bytes. Run by each quantization item on its own tokens (split16_size
// first, on the calling thread), per block so that the compiler vectorizes it.
void split16_size(Ctx& c) {
  const size_t n = static_cast<size_t>(c.d->num_tokens * c.kpad);
  c.q16_lo.resize(n);
  c.q16_hi.resize(n);
  c.hi_sum.resize(static_cast<size_t>(c.d->num_tokens * c.kb));
}

void split_codes16(Ctx& c, int64_t t0, int64_t t1) {
  const int64_t bs = c.d->block_size;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t b = 0; b < c.kb; ++b) {
      const int64_t at = t * c.kpad + b * bs;
      const int16_t* q = c.q16.data() + at;
      uint8_t* lo = c.q16_lo.data() + at;
      int8_t* hi = c.q16_hi.data() + at;
      int32_t sum = 0;
      for (int64_t k = 0; k < bs; ++k) {
        lo[k] = static_cast<uint8_t>(q[k] & 0xFF);
        hi[k] = static_cast<int8_t>(q[k] >> 8);  // arithmetic shift: floor(q / 256)
        sum += hi[k];
      }
      c.hi_sum[static_cast<size_t>(t * c.kb + b)] = sum;
    }
}

void quantize_tokens(Ctx& c, int64_t t0, int64_t t1) {
  const int zp = c.d->zero_point();
  const int64_t K = c.d->in_dim;
  const bool act16 = c.d->act_bits == 16;
  // the LoRA's sums per 32-chunk of the codes are the blocks' own when the blocks are 32 long (the default)
  const bool block_sums = c.lora_sums && c.d->block_size == kLoraChunk;
  // act_bits 16 with a LoRA: the shrink reads int8 codes (qlinear.h), so the row is quantized to int8 too
  std::vector<int32_t> sums8(act16 && c.lora_sums && !block_sums ? static_cast<size_t>(c.kb) : 0);
  for (int64_t t = t0; t < t1; ++t) {
    int32_t* qsum = c.zsum.data() + t * c.kb;
    float* dx = c.dx.data() + t * c.kb;
    if (c.a->norm_weight)
      c.isa->rms_norm_row(c.a->x + t * K, static_cast<int>(K), c.a->norm_weight, c.a->norm_eps,
                          c.normed.data() + t * K);
    if (act16) {
      c.isa->quantize_row16(c.xin + t * K, static_cast<int>(K), static_cast<int>(c.d->block_size),
                            c.q16.data() + t * c.kpad, dx, qsum);
      if (c.lora_sums)
        c.isa->quantize_row(c.xin + t * K, static_cast<int>(K), static_cast<int>(c.d->block_size),
                            c.q.data() + t * c.kpad, c.dx8.data() + t * c.kb,
                            block_sums ? c.qsum32.data() + t * c.kc : sums8.data());
    } else {
      c.isa->quantize_row(c.xin + t * K, static_cast<int>(K), static_cast<int>(c.d->block_size),
                          c.q.data() + t * c.kpad, dx, qsum);
    }
    for (int64_t b = 0; b < c.kb; ++b) {
      if (block_sums && !act16) c.qsum32[t * c.kc + b] = qsum[b];
      c.sx[t * c.kb + b] = dx[b] * static_cast<float>(qsum[b]);
      qsum[b] *= zp;  // now zp * qsum
    }
    if (!c.lora_sums || block_sums) continue;
    const int8_t* q = c.q.data() + t * c.kpad;
    for (int64_t ch = 0; ch < c.kc; ++ch) {
      int32_t s = 0;
      for (int e = 0; e < kLoraChunk; ++e) s += q[ch * kLoraChunk + e];
      c.qsum32[t * c.kc + ch] = s;
    }
  }
  if (c.tiled) tile_tokens(c, t0, t1);
  if (c.split16) split_codes16(c, t0, t1);
}

// Quantization item i: tokens [i * q_chunk, + q_chunk).
void quantize_item(void* usr, size_t i) {
  Ctx& c = *static_cast<Ctx*>(usr);
  const int64_t t0 = static_cast<int64_t>(i) * c.q_chunk;
  quantize_tokens(c, t0, std::min(c.d->num_tokens, t0 + c.q_chunk));
}

// ---- phase 2: LoRA

// Term e's rank on segment j: 0 without a slot, with a zero scale or weight.
int lora_rank(const Ctx& c, int64_t e, int j) {
  const QLinearArgs& a = *c.a;
  const int32_t s = a.token_adapter[e];
  if (s < 0 || a.lora_scale[s] == 0.f || (a.adapter_weight != nullptr && a.adapter_weight[e] == 0.f)) return 0;
  return a.seg[j].rank[s];
}

// Whether some term of token t has a rank on segment j (its columns then get a LoRA term).
bool token_ranked(const Ctx& c, int64_t t, int j) {
  for (int64_t k = 0; k < c.terms; ++k)
    if (lora_rank(c, t * c.terms + k, j) > 0) return true;
  return false;
}

// Term e's weight times its slot's scale (lscale * 1 = lscale exactly: a weight-1 term is the one-adapter LoRA).
float term_scale(const Ctx& c, int64_t e, int32_t slot) {
  const QLinearArgs& a = *c.a;
  return a.adapter_weight != nullptr ? a.lora_scale[slot] * a.adapter_weight[e] : a.lora_scale[slot];
}

// h [rank] -> qh [rank] int8 codes (qh past the rank stays 0) and coef = lscale * dh, as quantize_row does it
// (dh = absmax / 127, qh = rint(h * (1 / dh)), half to even).
void quantize_h(const float* h, int rank, float lscale, int8_t* qh, float* coef) {
  float amax = 0.f;
  for (int r = 0; r < rank; ++r) amax = std::max(amax, std::fabs(h[r]));
  const float dh = amax / 127.f;
  const float inv = dh != 0.f ? 1.f / dh : 0.f;
  for (int r = 0; r < rank; ++r) qh[r] = static_cast<int8_t>(std::nearbyint(h[r] * inv));
  *coef = lscale * dh;
}

// h of a quad's tokens on segment j (their shrink) -> int8 codes in qh, then the expand into lora [G, T, 8].
void expand_segment(Ctx& c, const Quad& q, int j, int32_t slot) {
  const QLinearArgs& a = *c.a;
  const QLinearLoraSegment& sg = a.seg[j];
  const int rank = sg.rank[slot];
  const int8_t* qh[kQTile];
  float coef[kQTile];
  float* out[kQTile];
  // column col of token t goes to lora[(col / 8 * T + t) * 8 + col % 8]: straight there when the segment starts
  // on a group boundary, else through rows [n, width] (the same values)
  const int64_t T = c.d->num_tokens, ostride = T * 8, layer = c.groups * T * 8;
  const bool direct = sg.col0 % 8 == 0;
  std::vector<float> rows(direct ? 0 : static_cast<size_t>(q.n * sg.width));
  for (int k = 0; k < q.n; ++k) {
    const int64_t e = q.t[k], t = e / c.terms;  // term e of token t goes to layer e % M
    int8_t* codes = c.qh[j].data() + e * sg.r_max;
    quantize_h(c.h[j].data() + e * sg.r_max, rank, term_scale(c, e, slot), codes, coef + k);
    qh[k] = codes;
    out[k] = direct ? c.lora.data() + (e % c.terms) * layer + (sg.col0 / 8 * T + t) * 8 : rows.data() + k * sg.width;
  }
  c.isa->lora_expand(qh, coef, q.n, (rank + 3) / 4, sg.B + slot * sg.r_max * sg.width, sg.width,
                     sg.B_scale + slot * sg.width, out, direct ? ostride : 8);
  for (int k = 0; !direct && k < q.n; ++k) {
    const int64_t e = q.t[k], t = e / c.terms;
    for (int64_t i = 0; i < sg.width; ++i) {
      const int64_t col = sg.col0 + i;
      c.lora[static_cast<size_t>((e % c.terms) * layer + (col / 8 * T + t) * 8 + col % 8)] = out[k][i];
    }
  }
}

// Up to kQTile tokens of one adapter: one shrink over its segments' A[slot] (q, k and v side by side, one pass over
// the tokens' codes), then per segment one pass over B[slot], each load serving all the tokens.
void lora_quad(void* usr, size_t i) {
  Ctx& c = *static_cast<Ctx*>(usr);
  const Quad& q = c.quads[i];
  const QLinearArgs& a = *c.a;
  const int64_t K = c.d->in_dim;
  const int32_t slot = a.token_adapter[q.t[0]];
  QLoraToken x[kQTile];
  for (int k = 0; k < q.n; ++k) {
    const int64_t t = q.t[k] / c.terms;  // the term's token
    x[k] = {c.q.data() + t * c.kpad, (c.d->act_bits == 16 ? c.dx8 : c.dx).data() + t * c.kb,
            c.qsum32.data() + t * c.kc};
  }
  QLoraShrink sh[kQLinearMaxSegments];
  for (int m = 0; m < q.n_segs; ++m) {
    const QLinearLoraSegment& sg = a.seg[q.segs[m]];
    const int rank = sg.rank[slot];
    sh[m] = {sg.A + slot * K * sg.r_max,
             sg.A_scale + slot * c.kc * sg.r_max,
             a.packed_a ? rank : static_cast<int>(sg.r_max),
             rank,
             {}};
    for (int k = 0; k < q.n; ++k) sh[m].h[k] = c.h[q.segs[m]].data() + q.t[k] * sg.r_max;
  }
  c.isa->lora_shrink(x, q.n, static_cast<int>(K), static_cast<int>(c.d->block_size), sh, q.n_segs);
  for (int m = 0; m < q.n_segs; ++m) expand_segment(c, q, q.segs[m], slot);
}

// A segment on the 8-column grid: its columns are whole groups of lora [G, T, 8].
bool on_grid(const QLinearLoraSegment& sg) {
  return sg.col0 % 8 == 0 && sg.width % 8 == 0;
}

// Every segment of the call on the grid.
bool all_on_grid(const QLinearArgs& a) {
  for (int j = 0; j < a.n_segments; ++j)
    if (!on_grid(a.seg[j])) return false;
  return true;
}

// lora [G, T, 8] <- 0 where no expand will write: the columns of each segment for the tokens without a LoRA on it.
// The expands write every column of their segment for their tokens, so a batch whose tokens all have an adapter
// needs no fill at all (zero-filling the whole buffer, 61 KB for q|k|v at B = 16, ran on the calling thread while
// the pool waited). Segments off the 8-column grid, or not covering the N columns, get the whole buffer zeroed.
void zero_lora_rows(Ctx& c) {
  const QLinearArgs& a = *c.a;
  const int64_t T = c.d->num_tokens, N = c.d->out_dim;
  c.lora.resize(static_cast<size_t>(c.layers * c.groups * T * 8));  // layers > 0 are read only where written
  int64_t covered = 0;
  for (int j = 0; j < a.n_segments; ++j) covered += a.seg[j].width;
  if (N % 8 != 0 || !all_on_grid(a) || covered != N) {
    std::fill_n(c.lora.begin(), c.groups * T * 8, 0.f);
    return;
  }
  for (int j = 0; j < a.n_segments; ++j)
    for (int64_t t = 0; t < T; ++t) {
      if (token_ranked(c, t, j)) continue;
      for (int64_t g = a.seg[j].col0 / 8; g < (a.seg[j].col0 + a.seg[j].width) / 8; ++g)
        std::fill_n(c.lora.data() + (g * T + t) * 8, 8, 0.f);
    }
}

// The LoRA's work: the terms with an adapter (a slot with a scale and a non-zero weight), sorted by slot (counting
// sort), in groups of up to kQTile terms of one slot, each on the segments where the slot has a rank (a slot has one
// on a segment for all its terms or none), and their buffers (none when no term has a rank > 0 here: an adapter on
// q, k, v, o costs gate|up and down nothing). Returns the multiply-adds.
int64_t plan_lora(Ctx& c) {
  const QLinearArgs& a = *c.a;
  const int64_t T = c.d->num_tokens, E = T * c.terms;
  std::vector<int64_t> count(static_cast<size_t>(a.n_slots) + 1), order(static_cast<size_t>(E));
  const auto ranked = [&](int64_t e) {  // the term's slot has a rank on some segment
    for (int j = 0; j < a.n_segments; ++j)
      if (lora_rank(c, e, j) > 0) return true;
    return false;
  };
  c.layers = 1;
  for (int64_t e = 0; e < E; ++e) {
    if (!ranked(e)) continue;
    ++count[a.token_adapter[e] + 1];
    if (e % c.terms > 0) c.layers = c.terms;  // a later term: this call mixes
  }
  for (int64_t s = 0; s < a.n_slots; ++s) count[s + 1] += count[s];
  const int64_t n = count[a.n_slots];
  if (n == 0) return 0;
  for (int64_t e = 0; e < E; ++e)
    if (ranked(e)) order[count[a.token_adapter[e]]++] = e;  // count[s] ends at slot s's end
  int64_t macs = 0;
  bool used[kQLinearMaxSegments] = {};
  for (int64_t i = 0; i < n;) {
    Quad q{0, {}, 0, {}};
    const int32_t slot = a.token_adapter[order[i]];
    while (i < n && q.n < kQTile && a.token_adapter[order[i]] == slot) q.t[q.n++] = order[i++];
    for (int j = 0; j < a.n_segments; ++j) {
      const int rank = lora_rank(c, q.t[0], j);
      if (rank == 0) continue;
      q.segs[q.n_segs++] = j, used[j] = true;
      macs += q.n * rank * (c.d->in_dim + a.seg[j].width);
    }
    c.quads.push_back(q);
  }
  for (int j = 0; j < a.n_segments; ++j) {
    if (!used[j]) continue;
    c.h[j].resize(static_cast<size_t>(E * a.seg[j].r_max));
    c.qh[j].assign(static_cast<size_t>(E * a.seg[j].r_max), 0);
  }
  zero_lora_rows(c);
  c.lbuf = c.lora.data();
  c.qsum32.resize(static_cast<size_t>(T * c.kc));
  c.lora_sums = true;
  return macs;
}

// One group's 8 columns of a token: its terms ks[0..n) (in k order) added into layer 0, the first taken as it is.
// Plain float adds in the row's own order, whoever runs them: the same bits whatever the batch or the ISA table.
// The compiler vectorizes the 8 lanes.
void add_terms8(float* out, const int64_t* ks, int64_t n, int64_t layer) {
  float v[8];
  const float* first = out + ks[0] * layer;
  for (int r = 0; r < 8; ++r) v[r] = first[r];
  for (int64_t i = 1; i < n; ++i) {
    const float* term = out + ks[i] * layer;
    for (int r = 0; r < 8; ++r) v[r] += term[r];
  }
  for (int r = 0; r < 8; ++r) out[r] = v[r];
}

// Token t's terms with a rank on segment j, in k order; false when layer 0 already holds its value (no term, or
// only k = 0).
bool terms_to_add(const Ctx& c, int64_t t, int j, int64_t* ks, int64_t* n) {
  *n = 0;
  for (int64_t k = 0; k < c.terms; ++k)
    if (lora_rank(c, t * c.terms + k, j) > 0) ks[(*n)++] = k;
  return *n > 1 || (*n == 1 && ks[0] != 0);
}

// Mixed tokens, when every segment is on the 8-column grid: each token's terms per segment as bits of mix_mask,
// which the projection's items read to add the terms of the groups they compute (merge_group), on both threads
// and while the values are in their core's cache. merge_terms on the calling thread, before the projection, was
// ~15% of the CPU samples of a 2-of-4 mixed step's LoRA work (TinyLlama shape, B = 16, q|k|v and o, perf) while the
// pool waited; here it is split over the pool and the mix's LoRA work went from 2.0x to 1.8x the samples of rows
// with one adapter each (docs/notes/adapters.md).
void plan_merge(Ctx& c) {
  const QLinearArgs& a = *c.a;
  const int64_t T = c.d->num_tokens;
  c.mix_mask.assign(static_cast<size_t>(T * kQLinearMaxSegments), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < a.n_segments; ++j) {
      int64_t ks[kQLinearMaxTerms], n = 0;
      if (!terms_to_add(c, t, j, ks, &n)) continue;
      uint8_t m = 0;
      for (int64_t i = 0; i < n; ++i) m = static_cast<uint8_t>(m | 1u << ks[i]);
      c.mix_mask[static_cast<size_t>(t * kQLinearMaxSegments + j)] = m;
    }
}

// Group g (8 output columns) of tokens [ts, ts + nt): their terms added into layer 0 (plan_merge's masks). Out of
// line so that profiles show it apart from project (the samples in docs/notes/adapters.md).
__attribute__((noinline)) void merge_group(const Ctx& c, int64_t g, int64_t ts, int nt) {
  const QLinearArgs& a = *c.a;
  int j = 0;
  while (j < a.n_segments && !(g * 8 >= a.seg[j].col0 && g * 8 < a.seg[j].col0 + a.seg[j].width)) ++j;
  if (j == a.n_segments) return;  // columns no adapter touches: layer 0 holds zeros
  const int64_t T = c.d->num_tokens, layer = c.groups * T * 8;
  for (int64_t t = ts; t < ts + nt; ++t) {
    const unsigned m = c.mix_mask[static_cast<size_t>(t * kQLinearMaxSegments + j)];
    if (m == 0) continue;
    int64_t ks[kQLinearMaxTerms], n = 0;
    for (int64_t k = 0; k < c.terms; ++k)
      if (m >> k & 1u) ks[n++] = k;
    add_terms8(c.lbuf + (g * T + t) * 8, ks, n, layer);
  }
}

// Mixed tokens with a segment off the 8-column grid: per segment, the terms with a rank there added in k order into
// layer 0 (add_terms8's adds), on the calling thread before the projection; a column at a time off the grid.
void merge_terms(Ctx& c) {
  const QLinearArgs& a = *c.a;
  const int64_t T = c.d->num_tokens, layer = c.groups * T * 8;
  float* l0 = c.lora.data();
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < a.n_segments; ++j) {
      int64_t ks[kQLinearMaxTerms], n = 0;
      if (!terms_to_add(c, t, j, ks, &n)) continue;
      const QLinearLoraSegment& sg = a.seg[j];
      if (on_grid(sg)) {
        for (int64_t g = sg.col0 / 8; g < (sg.col0 + sg.width) / 8; ++g) add_terms8(l0 + (g * T + t) * 8, ks, n, layer);
        continue;
      }
      for (int64_t col = sg.col0; col < sg.col0 + sg.width; ++col) {
        const int64_t at = (col / 8 * T + t) * 8 + col % 8;
        float v = l0[ks[0] * layer + at];
        for (int64_t i = 1; i < n; ++i) v += l0[ks[i] * layer + at];
        l0[at] = v;
      }
    }
}

// DoRA: each DoRA slot's scale row over the N columns, and each token's pointer to it (nullptr for tokens of other
// slots or none). Costs nothing when no token of the call has a DoRA slot.
void plan_dora(Ctx& c) {
  const QLinearArgs& a = *c.a;
  if (a.dora == nullptr || a.token_adapter == nullptr) return;
  const int64_t T = c.d->num_tokens, width = c.groups * 8;
  std::vector<int64_t> row_of(static_cast<size_t>(a.n_slots), -1);
  int64_t rows = 0;
  for (int64_t t = 0; t < T; ++t) {  // a DoRA slot is a row's only term (the op checks)
    const int32_t s = a.token_adapter[t * c.terms];
    if (s < 0 || a.dora[s] == 0 || row_of[s] >= 0) continue;
    bool ranked = false;
    for (int j = 0; j < a.n_segments; ++j) ranked = ranked || lora_rank(c, t * c.terms, j) > 0;
    if (ranked) row_of[s] = rows++;
  }
  if (rows == 0) return;
  c.dora_rows.assign(static_cast<size_t>(rows * width), 1.f);
  for (int64_t s = 0; s < a.n_slots; ++s) {
    if (row_of[s] < 0) continue;
    float* row = c.dora_rows.data() + row_of[s] * width;
    for (int j = 0; j < a.n_segments; ++j) {
      const QLinearLoraSegment& sg = a.seg[j];
      if (sg.rank[s] > 0) std::copy_n(a.dora_scale[j] + s * sg.width, sg.width, row + sg.col0);
    }
  }
  c.row_scale.assign(static_cast<size_t>(T), nullptr);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = a.token_adapter[t * c.terms];
    if (s >= 0 && row_of[s] >= 0) c.row_scale[t] = c.dora_rows.data() + row_of[s] * width;
  }
  c.scale_of = c.row_scale.data();
}

// ---- phase 3: projection + epilogue

}  // namespace

QTokens advance_tokens(const QTokens& x, int i, int kb) {
  QTokens r = x;
  const int64_t rows = static_cast<int64_t>(i) * x.q_stride, blocks = static_cast<int64_t>(i) * kb;
  if (r.q) r.q += rows;
  if (r.q16) r.q16 += rows;
  if (r.q16_lo) r.q16_lo += rows, r.q16_hi += rows, r.q16_hi_sum += blocks;
  r.dx += blocks, r.zsum += blocks, r.sx += blocks;
  if (r.q_tiles && i % kCodeTile == 0) {  // tile i / 16 starts i rows (and i * kb scales) on
    r.q_tiles += rows, r.dx_tiles += blocks, r.sx_tiles += blocks;
    if (r.qsum_tiles) r.qsum_tiles += blocks;
  } else {
    r.q_tiles = nullptr, r.dx_tiles = r.sx_tiles = nullptr, r.qsum_tiles = nullptr;
  }
  return r;
}

namespace {

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
  return {a.codes + g * c.group_bytes,
          a.d + g * kb8,
          a.m ? a.m + g * kb8 : nullptr,
          static_cast<int>(c.kb),
          static_cast<int>(c.d->block_size),
          c.d->bits,
          c.d->mxfp4};
}

// Group g's outputs (columns 8g..8g+7) for tokens ts..ts+nt-1 from their values v [nt, 8] (and up [nt, 8],
// a gated epilogue's up group), LoRA included: the epilogue, stored.
__attribute__((always_inline)) inline void finish_group(const Ctx& c, int64_t g, int64_t ts, int nt, float* v,
                                                        float* up) {
  const QLinearDims& d = *c.d;
  const QLinearArgs& a = *c.a;
  const bool gated = d.gated();
  const auto gate_mul8 = d.epilogue == QLinearEpilogue::kSwiGLU ? c.isa->silu_mul8 : c.isa->gelu_mul8;
  const int64_t N = d.out_dim, ycols = d.y_cols(), c0 = g * 8;
  alignas(32) float act[8], scaled[2][8];
  for (int i = 0; i < nt; ++i) {
    const int64_t t = ts + i;
    float* vi = v + 8 * i;
    const float* upi = up + 8 * i;
    if (c.scale_of != nullptr && c.scale_of[t] != nullptr) {  // a DoRA row: g * (x W^T + lora), then the epilogue
      const float* gs = c.scale_of[t] + c0;
      c.isa->mul8(vi, gs, scaled[0]);
      vi = scaled[0];
      if (gated) c.isa->mul8(upi, gs + N / 2, scaled[1]), upi = scaled[1];
    }
    if (a.n_outputs > 1) {  // split outputs: a.y is output 0 alone, [T, width_0], not [T, ycols]
      store_split(a, t, c0, static_cast<int>(std::min<int64_t>(8, N - c0)), vi);
      continue;
    }
    float* y = a.y + t * ycols + c0;
    if (gated) {
      gate_mul8(vi, upi, act);
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

// The quantized tokens from ts on, as the micro-kernels read them.
QTokens tokens(const Ctx& c, int64_t ts) {
  const bool act16 = c.d->act_bits == 16, tiles = c.tiled && ts % kCodeTile == 0;
  return {act16 ? nullptr : c.q.data() + ts * c.kpad,
          act16 ? c.q16.data() + ts * c.kpad : nullptr,
          c.kpad,
          c.dx.data() + ts * c.kb,
          c.zsum.data() + ts * c.kb,
          c.sx.data() + ts * c.kb,
          c.split16 ? c.q16_lo.data() + ts * c.kpad : nullptr,
          c.split16 ? c.q16_hi.data() + ts * c.kpad : nullptr,
          c.split16 ? c.hi_sum.data() + ts * c.kb : nullptr,
          tiles ? c.qt.data() + ts * c.kpad : nullptr,
          tiles ? c.dxt.data() + ts * c.kb : nullptr,
          tiles ? c.sxt.data() + ts * c.kb : nullptr,
          tiles && c.d->bits == 8 ? c.qst.data() + ts * c.kb : nullptr};
}

// Groups [g0, g1) x tokens [t0, t1): kQTile tokens at a time; with kPairTokens tokens or more, two groups per
// micro-kernel call where the ISA has group_dot2 (gated: the gate group with its up group; else neighbours), its
// dot2_tokens tokens a call (AMX: 16).
// Fewer tokens keep the 8-row kernel: paired, a B = 1 step with 1 or 2 drafts (T = 2, 3) measured 1.25x / 1.16x
// slower and the int4 LM head at T = 1 up to 2x slower; from T = 8 on, pairing is faster (B = 16 decode 1.14x,
// prefill 1.12-1.18x, one thread). Either way each output gets the same bits (qlinear.h).
// The micro-kernels accumulate from their output's value: zeros, or with a LoRA the group's rows of c.lora (each
// token's LoRA term, 0 for tokens without one), which they then overwrite with the outputs.
void project(const Ctx& c, int64_t g0, int64_t g1, int64_t t0, int64_t t1) {
  const bool gated = c.d->gated();
  const bool act16 = c.d->act_bits == 16;
  const auto dot2 = c.d->mxfp4 ? c.isa->group_dot2_mxfp4 : c.isa->group_dot2;
  const bool pair = (act16 ? c.split16 : dot2 != nullptr) && t1 - t0 >= kPairTokens;
  const int64_t T = c.d->num_tokens;
  // tokens per pass over a group (pair)
  const int64_t tile = pair ? std::max(c.isa->dot2_tokens, c.isa->gemm_tokens) : kQTile;
  alignas(32) float zeros[3][kGemmTokensMax * 8];
  for (int64_t g = g0; g < g1;) {
    const int n = !gated && pair && g + 1 < g1 ? 2 : 1;  // groups finished by this pass
    const int64_t g2 = gated ? g + c.groups / 2 : n == 2 ? g + 1 : g;
    const QGroup wg = group(c, g), w2 = group(c, g2);
    for (int64_t ts = t0; ts < t1; ts += tile) {
      const int nt = static_cast<int>(std::min<int64_t>(tile, t1 - ts));
      if (c.merge_in_project) {  // a mixed call: this tile's LoRA terms added into layer 0 first
        merge_group(c, g, ts, nt);
        if (g2 != g) merge_group(c, g2, ts, nt);
      }
      float* v0 = c.lbuf ? c.lbuf + (g * T + ts) * 8 : zeros[0];
      float* v1 = c.lbuf ? c.lbuf + (g2 * T + ts) * 8 : zeros[1];
      if (!c.lbuf) std::fill_n(&zeros[0][0], nt * 8, 0.f), std::fill_n(&zeros[1][0], nt * 8, 0.f);
      float* up = gated ? v1 : zeros[2];
      const int groups = gated || n == 2 ? 2 : 1;
      c.isa->gemm(*c.isa, {wg, w2, groups, pair && groups == 2, act16, tokens(c, ts), nt, v0, v1});
      finish_group(c, g, ts, nt, v0, up);
      if (n == 2) finish_group(c, g + 1, ts, nt, v1, up);
    }
    g += n;
  }
}

// Item gi's maximum of tokens [t0, t1) over the columns of groups [g0, g1) (the last group's padding left out),
// and its first column: read back from y right after the item wrote it.
void item_argmax(Ctx& c, int64_t gi, int64_t g0, int64_t g1, int64_t t0, int64_t t1) {
  const int64_t N = c.d->out_dim, c0 = g0 * 8, n = std::min(N, g1 * 8) - c0;
  for (int64_t t = t0; t < t1; ++t) {
    const float* y = c.a->y + t * N + c0;
    const int i = c.vec->argmax(y, static_cast<int>(n));
    c.best[t * c.g_items + gi] = y[i];
    c.best_at[t * c.g_items + gi] = c0 + i;
  }
}

// Row t's first maximum over all items, in column order: a later item wins only with a larger value.
void merge_argmax(const Ctx& c) {
  for (int64_t t = 0; t < c.d->num_tokens; ++t) {
    const float* v = c.best.data() + t * c.g_items;
    const int64_t* at = c.best_at.data() + t * c.g_items;
    int64_t k = 0;
    for (int64_t gi = 1; gi < c.g_items; ++gi)
      if (v[gi] > v[k]) k = gi;
    c.a->argmax[t] = at[k];
  }
}

void project_item(void* usr, size_t i) {
  Ctx& c = *static_cast<Ctx*>(usr);
  const int64_t gi = static_cast<int64_t>(i) % c.g_items, ti = static_cast<int64_t>(i) / c.g_items;
  const int64_t g0 = gi * c.g_chunk, t0 = ti * c.t_chunk;
  const int64_t g1 = std::min(c.out_groups, g0 + c.g_chunk), t1 = std::min(c.d->num_tokens, t0 + c.t_chunk);
  project(c, g0, g1, t0, t1);
  if (c.a->argmax) item_argmax(c, gi, g0, g1, t0, t1);
}

}  // namespace

// QLinearIsa::gemm from a table's group dots: the two-group kernel for a paired tile, else the one-group kernels
// kQTile tokens a call (on both groups of a gated tile).
void gemm_by_group_dots(const QLinearIsa& isa, const QGemmTile& t) {
  if (t.paired) {  // dot2_tokens a call (a table's gemm_tokens may give the tile more)
    const auto dot2 = t.act16 ? isa.group_dot2_16 : t.w0.mxfp4 ? isa.group_dot2_mxfp4 : isa.group_dot2;
    for (int i = 0; i < t.nt; i += isa.dot2_tokens)
      dot2(t.w0, t.w1, advance_tokens(t.x, i, t.w0.kb), std::min(isa.dot2_tokens, t.nt - i), t.out0 + 8 * i,
           t.out1 + 8 * i);
    return;
  }
  const auto dot = t.act16 ? isa.group_dot16 : t.w0.mxfp4 ? isa.group_dot_mxfp4 : isa.group_dot;
  for (int i = 0; i < t.nt; i += kQTile) {
    const int ni = std::min(kQTile, t.nt - i);
    const QTokens tok = advance_tokens(t.x, i, t.w0.kb);
    dot(t.w0, tok, ni, t.out0 + 8 * i);
    if (t.groups == 2) dot(t.w1, tok, ni, t.out1 + 8 * i);
  }
}

void qlinear(const QLinearDims& d, const QLinearArgs& a, const Parallel& par, const OpsIsa& isa) {
  const int64_t T = d.num_tokens;
  if (T == 0 || d.out_dim == 0) return;
  Scratch& scratch = thread_scratch();
  Ctx c(scratch);
  c.d = &d;
  c.a = &a;
  c.isa = isa.qlinear;
  c.vec = isa.vec;
  c.kb = d.k_blocks();
  c.groups = d.groups();
  c.kpad = c.kb * d.block_size;
  c.group_bytes = c.kb * d.block_size * d.bits;  // 8 rows x kb blocks x bs codes x bits / 8
  c.out_groups = d.gated() ? c.groups / 2 : c.groups;
  const bool parallel = c.groups * c.group_bytes * T >= kParallelBytes;

  if (d.act_bits == 16)
    c.q16.resize(static_cast<size_t>(T * c.kpad));
  else
    c.q.resize(static_cast<size_t>(T * c.kpad));
  c.dx.resize(static_cast<size_t>(T * c.kb));
  c.sx.resize(static_cast<size_t>(T * c.kb));
  c.zsum.resize(static_cast<size_t>(T * c.kb));
  if (a.norm_weight) c.normed.resize(static_cast<size_t>(T * d.in_dim));
  c.kc = (d.in_dim + kLoraChunk - 1) / kLoraChunk;
  const bool split_quantize = parallel && T >= kQuantizeSplit;
  c.q_chunk = !split_quantize ? T : T > 2 * kQuantizeChunk ? kQuantizeChunk : (T + 1) / 2;
  c.terms = a.adapter_terms;
  const int64_t lora_macs = a.token_adapter != nullptr && a.n_segments > 0 ? plan_lora(c) : 0;
  if (lora_macs > 0) plan_dora(c);
  if (d.act_bits == 16 && c.lora_sums) {  // the LoRA's int8 codes beside the int16 ones
    c.q.resize(static_cast<size_t>(T * c.kpad));
    c.dx8.resize(static_cast<size_t>(T * c.kb));
  }
  c.xin = a.norm_weight ? c.normed.data() : a.x;
  c.tiled = c.isa->tiled_codes && d.act_bits == 8 && !d.mxfp4 && T >= kPairTokens;
  if (c.tiled) size_tiles(c);  // the quantization items then tile their tokens' codes
  c.split16 = d.act_bits == 16 && c.isa->group_dot2_16 != nullptr && T >= kPairTokens;
  if (c.split16) split16_size(c);  // and split their int16 codes into bytes
  if (split_quantize) {
    par.run(static_cast<size_t>((T + c.q_chunk - 1) / c.q_chunk), quantize_item, &c);
  } else {
    quantize_tokens(c, 0, T);
  }

  if (lora_macs >= kParallelLoraMacs && c.quads.size() > 1) {
    par.run(c.quads.size(), lora_quad, &c);
  } else {
    for (size_t i = 0; i < c.quads.size(); ++i) lora_quad(&c, i);
  }
  if (c.layers > 1) {
    c.merge_in_project = all_on_grid(a);
    if (c.merge_in_project)
      plan_merge(c);
    else
      merge_terms(c);
  }

  c.t_chunk = std::min(T, kTokenChunk);
  const int64_t t_items = (T + c.t_chunk - 1) / c.t_chunk;
  // about 16 items along the rows at decode, finer with more token chunks (prefill)
  c.g_chunk = std::max<int64_t>(1, std::min<int64_t>(32, c.out_groups / std::max<int64_t>(1, 16 / t_items)));
  if (t_items >= 16) c.g_chunk = std::max<int64_t>(1, std::min<int64_t>(c.g_chunk, 8));
  c.g_items = (c.out_groups + c.g_chunk - 1) / c.g_chunk;
  if (a.argmax) {
    c.best.resize(static_cast<size_t>(T * c.g_items));
    c.best_at.resize(static_cast<size_t>(T * c.g_items));
  }
  if (parallel) {
    par.run(static_cast<size_t>(c.g_items * t_items), project_item, &c);
  } else {
    for (int64_t i = 0; i < c.g_items * t_items; ++i) project_item(&c, static_cast<size_t>(i));
  }
  if (a.argmax) merge_argmax(c);
  trim(scratch);
}

}  // namespace ortllm
