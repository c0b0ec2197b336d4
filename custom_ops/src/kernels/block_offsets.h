// Pure kernel of the asymmetric quantized projection's offset term (pipeline/quantize.py):
//   y[t, :] += sum_b blocksum_b(x[t]) * offsets[b, :],  blocksum_b(x[t]) = sum of x[t, b*bs : (b+1)*bs]
// i.e. the "+ m" of w = d*q + m (llama.cpp Q4_1) that MatMulNBits' symmetric path leaves out.
#pragma once
#include <cstdint>

#include "parallel.h"

namespace ortllm {

struct BlockOffsetsDims {
  int64_t num_tokens;  // T
  int64_t in_dim;      // K (the last block may be short)
  int64_t out_dim;     // N
  int64_t block_size;  // bs; k_blocks = ceil(K / bs)
};

// x [T, K], offsets [k_blocks, N] IEEE fp16 bits, y [T, N] (accumulated into).
struct OpsIsa;
// isa: the session's row of the ISA registry (isa.h).
void add_block_offsets(const BlockOffsetsDims& d, const float* x, const uint16_t* offsets, float* y,
                       const Parallel& par, const OpsIsa& isa);

}  // namespace ortllm
