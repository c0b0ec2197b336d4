// Offset term of an asymmetric quantized projection (shapes in block_offsets.h).
//
// What: sums[t, b] = sum of x[t] over block b; then y[t] += sums[t] @ offsets ([k_blocks, N]).
// Why this way: k_blocks is small (K / 32 = 18 for SmolLM2), so the term is a thin GEMM
// (T x k_blocks x N) through VecOps::gemm_rows_f16b. The table is fp16 because at decode it is
// streamed from memory once per call, beside int4 weights: fp32 would add ~20% to the bytes
// the step reads, fp16 ~10%. It rides in the MultiLoRA call that already holds
// x and y, instead of three more graph nodes per projection.
// Threads: below kParallelMacs it runs on the calling thread (a decode step); above, items are
// kColChunk output columns, which write disjoint ranges of y.
#include "block_offsets.h"

#include <algorithm>
#include <vector>

#include "isa.h"
#include "vec.h"

namespace ortllm {
namespace {

constexpr int64_t kColChunk = 256;
constexpr int64_t kRowChunk = 256;  // row pointers shifted to a column, on the stack (no allocation per call)
constexpr int64_t kParallelMacs = 1 << 20;

struct Ctx {
  const BlockOffsetsDims* d;
  int64_t k_blocks;
  const uint16_t* offsets;
  const float* const* s_rows;  // [T] rows of sums [T, k_blocks]
  float* const* y_rows;        // [T] rows of y
  const VecOps* vec;
};

// y[:, col0 : col0 + cols] += sums @ offsets[:, col0 : col0 + cols]
void columns(const Ctx& c, int64_t col0, int64_t cols) {
  float* y[kRowChunk];
  for (int64_t r0 = 0; r0 < c.d->num_tokens; r0 += kRowChunk) {
    const int64_t m = std::min(kRowChunk, c.d->num_tokens - r0);
    for (int64_t t = 0; t < m; ++t) y[t] = c.y_rows[r0 + t] + col0;
    c.vec->gemm_rows_f16b(static_cast<int>(m), static_cast<int>(cols), static_cast<int>(c.k_blocks), 1.f, c.s_rows + r0,
                          c.offsets + col0, static_cast<int>(c.d->out_dim), y);
  }
}

void column_item(void* usr, size_t i) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  const int64_t col0 = static_cast<int64_t>(i) * kColChunk;
  columns(c, col0, std::min(kColChunk, c.d->out_dim - col0));
}

}  // namespace

void add_block_offsets(const BlockOffsetsDims& d, const float* x, const uint16_t* offsets, float* y,
                       const Parallel& par, const OpsIsa& isa) {
  const int64_t kb = (d.in_dim + d.block_size - 1) / d.block_size;
  if (d.num_tokens == 0 || d.out_dim == 0 || kb == 0) return;
  std::vector<float> sums(static_cast<size_t>(d.num_tokens * kb));  // [T, k_blocks]
  std::vector<const float*> s_rows(static_cast<size_t>(d.num_tokens));
  std::vector<float*> y_rows(static_cast<size_t>(d.num_tokens));
  for (int64_t t = 0; t < d.num_tokens; ++t) {
    const float* xt = x + t * d.in_dim;
    float* st = sums.data() + t * kb;
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t end = std::min(d.in_dim, (b + 1) * d.block_size);
      float acc = 0.f;
      for (int64_t k = b * d.block_size; k < end; ++k) acc += xt[k];
      st[b] = acc;
    }
    s_rows[t] = st;
    y_rows[t] = y + t * d.out_dim;
  }
  Ctx c{&d, kb, offsets, s_rows.data(), y_rows.data(), isa.vec};
  if (d.num_tokens * kb * d.out_dim < kParallelMacs) {
    columns(c, 0, d.out_dim);
  } else {
    par.run(static_cast<size_t>((d.out_dim + kColChunk - 1) / kColChunk), column_item, &c);
  }
}

}  // namespace ortllm
