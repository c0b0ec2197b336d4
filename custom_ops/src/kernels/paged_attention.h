// Pure PagedAttention kernel: RoPE + (quantized caches) Hadamard + quantize new K/V into a paged cache, then
// causal GQA attention of each new token over its sequence's cached and new tokens.
// Plain pointers and sizes; the ORT wrapper validates every shape and index before calling.
#pragma once
#include <cstdint>

#include "parallel.h"
#include "quant.h"

namespace ortllm {

struct PagedAttentionDims {
  int64_t num_tokens;  // T
  int64_t num_seqs;    // S
  int64_t num_heads;   // H
  int64_t kv_heads;    // Hkv (H % Hkv == 0)
  int64_t head_size;   // D (even; a power of two when rotate)
  int64_t block_size;  // BS
  int64_t max_blocks;  // columns of block_tables
  int64_t num_blocks;  // NB, blocks in the pool
  int64_t max_pos;     // rows of the rope cache
  KvDtype kv_dtype;
  bool rotate;  // Hadamard on Q and K (quantized caches), and on V for int4 (each output row rotated back)
  bool rope_interleaved;
  float scale;         // softmax scale
  int64_t window = 0;  // > 0: a query at position p sees keys p - window + 1 .. p (sliding-window layers); 0: all
};

struct PagedAttentionArgs {
  const float* q;                // [T, H*D]
  const float* k;                // [T, Hkv*D]
  const float* v;                // [T, Hkv*D]
  const int32_t* positions;      // [T]        rope position of each token
  const int32_t* cu_seqlens;     // [S+1]      token t belongs to s iff cu[s] <= t < cu[s+1]
  const int32_t* context_lens;   // [S]        tokens already cached; token j of s goes to slot ctx[s]+j
  const int32_t* block_tables;   // [S, max_blocks]
  const float* cos;              // [max_pos, D/2]
  const float* sin;              // [max_pos, D/2]
  void* key_cache;               // [NB, Hkv, BS, D] float or uint8 codes, int4: [NB, Hkv, BS, D / 2] packed codes
                                 // (quant.h quantize_int4) (output buffer, updated in place)
  void* value_cache;             // as key_cache
  uint16_t* key_scales;          // [NB, Hkv, BS] fp16 bits (quantized caches only)
  uint16_t* value_scales;        // [NB, Hkv, BS] fp16 bits (quantized caches only)
  float* out;                    // [T, H*D]
  const float* sinks = nullptr;  // [H] or nullptr: head h's row softmax has e^sinks[h] in its denominator (gpt-oss)
};

// Writes the new K/V rows into the caches and the attention result into out.
struct OpsIsa;
// isa: the session's row of the ISA registry (isa.h); every row gives the same bits.
void paged_attention(const PagedAttentionDims& dims, const PagedAttentionArgs& args, const Parallel& par,
                     const OpsIsa& isa);

}  // namespace ortllm
