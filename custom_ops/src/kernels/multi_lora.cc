// MultiLoRA kernel (pure; shapes in multi_lora.h).
//
// What: y[t] += scale[a] * (x[t] @ A[a][:, :r]) @ B[a][:r, :] for a = token_adapter[t] != -1,
// r = rank[a]. Rows of A/B past a slot's rank are never read (slots are padded to r_max).
// Why this way: tokens are grouped by adapter with a counting sort, so each distinct adapter costs
// one shrink GEMM ([n_a, in] @ [in, r] -> h [n_a, r] fp32) and one expand GEMM ([n_a, r] @ [r, out]
// times scale, added into y), reading A[a] and B[a] once per call instead of once per token (a
// per-token GEMV streams the adapter weights T times). At decode that one read is what LoRA costs:
// hence packed_a: with A [in, r_max] rows and rank < r_max, every 64-byte line of A also carries the
// padding columns (rank 16 under r_max 32 streams twice the bytes), while packed [in, rank] rows read
// only the adapter's own bytes; B's rows past rank are never touched either way.
// with 4 adapters of rank 16 on q,k,v,o the stacks are ~30 MB a step in fp32 beside ~67 MB of int4
// base weights, so A and B are fp16 (half the bytes), widened to fp32 as they stream; h, y and the
// accumulation stay fp32. The GEMMs take row-pointer arrays (VecOps::gemm_rows_f16b, AVX2 4x16
// micro-kernel with F16C), so the scattered token rows of x and y are used in place: no gather,
// no scatter, no copy. -1 tokens are never touched.
// Threads: small calls (below kParallelMacs multiply-adds, e.g. T = 16 decode steps) run on the
// calling thread, since waking the pool costs more than the work; larger ones run on the session
// pool: phase 1 items = (group, kRowChunk tokens) shrink, phase 2 items = (group, kColChunk
// output columns) expand; items write disjoint ranges.
#include "multi_lora.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "isa.h"
#include "vec.h"

namespace ortllm {
namespace {

constexpr int64_t kRowChunk = 4;
constexpr int64_t kColChunk = 128;
constexpr int64_t kParallelMacs = 1 << 20;

struct Group {
  int32_t slot;
  int64_t begin, end;  // range in the sorted token order
};

struct Ctx {
  const MultiLoraDims* d;
  const MultiLoraArgs* a;
  const Group* groups;
  const float* const* x_rows;  // [n_active] x rows, sorted by adapter
  float* const* y_rows;        // [n_active] y rows, same order
  float* const* h_rows;        // [n_active] rows of the shrink result h [n_active, r_max]
  std::vector<std::pair<int32_t, int64_t>> shrink_items, expand_items;  // (group, chunk start)
  const VecOps* vec;
};

void shrink(const Ctx& c, const Group& g, int64_t row0, int64_t n) {
  const MultiLoraDims& d = *c.d;
  const int rank = c.a->rank[g.slot];
  c.vec->gemm_rows_f16b(static_cast<int>(n), rank, static_cast<int>(d.in_dim), 1.f, c.x_rows + g.begin + row0,
                        c.a->A + g.slot * d.in_dim * d.max_rank, d.packed_a ? rank : static_cast<int>(d.max_rank),
                        c.h_rows + g.begin + row0);
}

void expand(const Ctx& c, const Group& g, int64_t col0, int64_t cols) {
  const MultiLoraDims& d = *c.d;
  const int64_t n = g.end - g.begin;
  float* y_cols[kRowChunk * 64];  // row pointers shifted to col0, in chunks
  for (int64_t r0 = 0; r0 < n; r0 += kRowChunk * 64) {
    const int64_t m = std::min<int64_t>(kRowChunk * 64, n - r0);
    for (int64_t i = 0; i < m; ++i) y_cols[i] = c.y_rows[g.begin + r0 + i] + col0;
    c.vec->gemm_rows_f16b(static_cast<int>(m), static_cast<int>(cols), c.a->rank[g.slot], c.a->scale[g.slot],
                          c.h_rows + g.begin + r0, c.a->B + g.slot * d.max_rank * d.out_dim + col0,
                          static_cast<int>(d.out_dim), y_cols);
  }
}

void shrink_item(void* usr, size_t i) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  const auto [gi, row0] = c.shrink_items[i];
  const Group& g = c.groups[gi];
  shrink(c, g, row0, std::min(kRowChunk, g.end - g.begin - row0));
}

void expand_item(void* usr, size_t i) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  const auto [gi, col0] = c.expand_items[i];
  expand(c, c.groups[gi], col0, std::min(kColChunk, c.d->out_dim - col0));
}

// Term k of every token (slot token_adapter[t * terms + k]): y[t] += scale * (w * (x A)) B.
void multi_lora_term(const MultiLoraDims& d, const MultiLoraArgs& a, int64_t k, const Parallel& par, const VecOps& v) {
  const auto slot_of = [&](int64_t t) {
    const int64_t e = t * a.terms + k;
    return a.weight != nullptr && a.weight[e] == 0.f ? -1 : a.token_adapter[e];  // weight 0: nothing to add
  };
  // counting sort of the active tokens by slot
  std::vector<int64_t> count(static_cast<size_t>(d.num_slots) + 1, 0);
  std::vector<float> w_rows;  // [n_active] each row's weight, sorted like the rows (with weights)
  for (int64_t t = 0; t < d.num_tokens; ++t)
    if (slot_of(t) >= 0) ++count[slot_of(t) + 1];
  for (int64_t s = 0; s < d.num_slots; ++s) count[s + 1] += count[s];
  const int64_t n_active = count[d.num_slots];
  if (n_active == 0) return;
  std::vector<const float*> x_rows(static_cast<size_t>(n_active));
  std::vector<float*> y_rows(static_cast<size_t>(n_active)), h_rows(static_cast<size_t>(n_active));
  std::vector<float> h(static_cast<size_t>(n_active * d.max_rank), 0.f);  // [n_active, r_max]
  {
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    if (a.weight != nullptr) w_rows.resize(static_cast<size_t>(n_active));
    for (int64_t t = 0; t < d.num_tokens; ++t) {
      const int32_t s = slot_of(t);
      if (s < 0) continue;
      const int64_t i = fill[s]++;
      x_rows[i] = a.x + t * d.in_dim;
      y_rows[i] = a.y + t * d.out_dim;
      if (a.weight != nullptr) w_rows[static_cast<size_t>(i)] = a.weight[t * a.terms + k];
    }
    for (int64_t i = 0; i < n_active; ++i) h_rows[i] = h.data() + i * d.max_rank;
  }
  std::vector<Group> groups;
  int64_t macs = 0;
  for (int64_t s = 0; s < d.num_slots; ++s) {
    if (count[s + 1] > count[s] && a.rank[s] > 0 && a.scale[s] != 0.f) {
      groups.push_back({static_cast<int32_t>(s), count[s], count[s + 1]});
      macs += (count[s + 1] - count[s]) * a.rank[s] * (d.in_dim + d.out_dim);
    }
  }
  if (groups.empty()) return;

  Ctx c{&d, &a, groups.data(), x_rows.data(), y_rows.data(), h_rows.data(), {}, {}, &v};
  // h row i *= its weight, between the shrink and the expand (w = 1 leaves h as it is)
  const auto weigh = [&](const Group& g) {
    for (int64_t i = g.begin; !w_rows.empty() && i < g.end; ++i)
      for (int r = 0; r < a.rank[g.slot]; ++r) h_rows[static_cast<size_t>(i)][r] *= w_rows[static_cast<size_t>(i)];
  };
  if (macs < kParallelMacs) {
    for (const Group& g : groups) {
      shrink(c, g, 0, g.end - g.begin);
      weigh(g);
      expand(c, g, 0, d.out_dim);
    }
    return;
  }
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (int64_t r0 = 0; r0 < groups[gi].end - groups[gi].begin; r0 += kRowChunk)
      c.shrink_items.emplace_back(static_cast<int32_t>(gi), r0);
    for (int64_t c0 = 0; c0 < d.out_dim; c0 += kColChunk) c.expand_items.emplace_back(static_cast<int32_t>(gi), c0);
  }
  par.run(c.shrink_items.size(), shrink_item, &c);
  for (const Group& g : groups) weigh(g);
  par.run(c.expand_items.size(), expand_item, &c);
}

}  // namespace

// The terms in k order: each row's adds into y follow its own terms, whatever else the batch holds.
void multi_lora(const MultiLoraDims& d, const MultiLoraArgs& a, const Parallel& par, const OpsIsa& isa) {
  for (int64_t k = 0; k < a.terms; ++k) multi_lora_term(d, a, k, par, *isa.vec);
}

void dora_scale_rows(const MultiLoraDims& d, const MultiLoraArgs& a, const int32_t* dora, const float* g) {
  for (int64_t t = 0; t < d.num_tokens; ++t) {
    const int32_t s = a.token_adapter[t * a.terms];  // a DoRA slot is its row's only term (the op checks)
    if (s < 0 || dora[s] == 0 || a.rank[s] == 0 || a.scale[s] == 0.f) continue;
    float* y = a.y + t * d.out_dim;
    const float* gs = g + s * d.out_dim;
    for (int64_t n = 0; n < d.out_dim; ++n) y[n] *= gs[n];
  }
}

}  // namespace ortllm
