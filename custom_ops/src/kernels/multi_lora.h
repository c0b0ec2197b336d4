// Pure MultiLoRA kernel: y[t] += scale[a] * (x[t] @ A[a][:, :rank[a]]) @ B[a][:rank[a], :],
// a = token_adapter[t] (-1: nothing). Mixes (ops ABI 14): token t has up to `terms` slots a_k =
// token_adapter[t * terms + k] with weights w_k, and y[t] += scale[a_k] * (w_k * (x[t] @ A[a_k])) @ B[a_k] for
// k = 0, 1, ... in that order (one pass over the tokens per k; h scaled by w_k, exact for w = 1). y must already hold
// base_y (the wrapper copies it unless the output aliases base_y). A and B are IEEE fp16 bits (the slot stacks: their
// bytes are the cost); x, y, scale and all accumulation are fp32. Plain pointers and sizes; the wrapper validates
// shapes and indices.
#pragma once
#include <cstdint>

#include "parallel.h"

namespace ortllm {

struct MultiLoraDims {
  int64_t num_tokens;  // T
  int64_t in_dim;      // in
  int64_t out_dim;     // out (may be q|k|v concatenated)
  int64_t num_slots;   // n_slots
  int64_t max_rank;    // r_max
  bool packed_a;       // slot s of A holds row-major [in, rank[s]] at its start (row stride rank[s], not r_max)
};

struct MultiLoraArgs {
  const float* x;                 // [T, in]
  const uint16_t* A;              // [n_slots, in, r_max] fp16 bits (packed_a: see MultiLoraDims)
  const uint16_t* B;              // [n_slots, r_max, out] fp16 bits
  const float* scale;             // [n_slots]
  const int32_t* rank;            // [n_slots], 0 <= rank <= r_max
  const int32_t* token_adapter;   // [T, terms], -1 or a slot (a row's -1s after its slots)
  float* y;                       // [T, out], holds base_y on entry
  int64_t terms = 1;              // slots a token mixes (token_adapter's second extent)
  const float* weight = nullptr;  // [T, terms] each term's weight, or nullptr (1)
};

struct OpsIsa;
// isa: the session's row of the ISA registry (isa.h).
void multi_lora(const MultiLoraDims& dims, const MultiLoraArgs& args, const Parallel& par, const OpsIsa& isa);

// DoRA rows (PEFT use_dora; a DoRA slot is its row's only term, weight 1): y[t] *= g[a] for tokens whose slot a is
// flagged (dora[a] != 0) and has a LoRA here (rank[a] > 0, scale[a] != 0); g [n_slots, out] is each slot's per-output
// scale m / ||W + s B A||_row. Called after multi_lora and the block offsets, so a DoRA row is g * (x W^T + s (x A) B);
// other rows are not touched.
void dora_scale_rows(const MultiLoraDims& dims, const MultiLoraArgs& args, const int32_t* dora, const float* g);

}  // namespace ortllm
