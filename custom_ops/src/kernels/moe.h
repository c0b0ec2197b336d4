// Pure MoE kernel: a mixture-of-experts SwiGLU FFN whose experts are QLinear-quantized (qlinear.h), tokens grouped
// by expert inside the call.
//
//   y[t] = sum_{j < k} w[t, j] * (down_e(act(gate_up_e(x[t]) + bgu_e)) + bd_e),   e = expert[t, j]
//
// act: SwiGLU SiLU(gate) * up, or gpt-oss's clamped SwiGLU (MoeActivation::kClampedSwiGLU):
//   g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(alpha * g);
// bgu_e [2I] (gate then up) and bd_e [H] are the experts' optional biases (gpt-oss).
//
// x [T, H] is the FFN's input (already normed: the router reads it too, in the graph); expert [T, k] and w [T, k] are
// the router's top-k ids and weights (softmax, top-k, renormalised or not: the graph's choice). Each expert's
// gate|up is a QLinear weight of N = 2I rows over K = H (gate rows [0, I), up rows [I, 2I): the "swiglu" epilogue's
// layout), its down one of N = H rows over K = I, both in QLinear's packed layout (pipeline/qlinear_pack.py), stacked
// over the E experts: gate_up codes [E, G_gu, kb_gu, bs * bits] with G_gu = 2I / 8, kb_gu = ceil(H / bs); down codes
// [E, G_d, kb_d, bs * bits] with G_d = ceil(H / 8), kb_d = ceil(I / bs); d and m [E, G, kb, 8] fp16 (m optional).
// With mxfp4 (gpt-oss's MXFP4 experts kept exact) both projections' 4-bit codes index QLinear's MXFP4 table.
//
// Per call: the (token, j) terms are grouped by expert (each expert's terms in token order); each expert with terms
// gathers its tokens' rows of x and runs its gate|up (SwiGLU epilogue) then its down on them as two QLinear calls,
// so each expert's weight rows are swept once by all of its tokens; then each token's output is the sum over j, in
// j order, of w[t, j] times its term's row (float32 multiply and add, never contracted: the same bits on every path).
// Threads go over experts (the experts with few tokens, one thread each) and over N (an expert with many tokens, or
// the only one, gets the pool inside its QLinear calls); never over K. With biases or the clamped activation the
// gate|up runs without its epilogue into [n, 2I], and the bias and the activation follow row by row in plain
// float32 code of this file (the same bits on every ISA path); the down's bias is added to each term's row.
//
// Batch invariance: QLinear's output row for a token depends on that row of its input alone (qlinear.h: not on T,
// the token tile or the thread split), so a term's row is the same whichever other tokens share its expert, and the
// combine is per token in a fixed order: a token's y is the same bits alone or in any batch.
#pragma once
#include <cstdint>

#include "parallel.h"

namespace ortllm {

enum class MoeActivation { kSwiGLU, kClampedSwiGLU };

struct MoeDims {
  int64_t num_tokens;  // T
  int64_t hidden;      // H: x's width and down's output
  int64_t inter;       // I: an expert's FFN width (gate_up has 2I rows; a multiple of 8)
  int64_t n_experts;   // E
  int64_t top_k;       // k: terms a token
  int64_t block_size;  // bs of both projections, a multiple of 32
  int bits;            // 4 or 8, both projections
  bool mxfp4 = false;  // bits 4, both projections' codes index kMxfp4Table (qlinear.h; no offsets)
  MoeActivation activation = MoeActivation::kSwiGLU;
  float alpha = 1.702f, limit = 7.f;  // kClampedSwiGLU's sigmoid slope and clamp
};

// One projection stacked over the experts: expert e's QLinear weight at codes + e * expert_codes, ...
struct MoeWeights {
  const uint8_t* codes;  // [E, G, kb, bs * bits]
  const uint16_t* d;     // [E, G, kb, 8] fp16 bits
  const uint16_t* m;     // [E, G, kb, 8] fp16 bits, or nullptr
};

struct MoeArgs {
  const float* x;         // [T, H]
  const int64_t* expert;  // [T, k] ids in [0, E) (the op checks them)
  const float* weight;    // [T, k]
  MoeWeights gate_up, down;
  const float* gate_up_bias;  // [E, 2I] (gate then up) or nullptr
  const float* down_bias;     // [E, H] or nullptr
  float* y;                   // [T, H]
};

struct OpsIsa;
// isa: the session's row of the ISA registry (isa.h); every row gives the same bits.
void moe(const MoeDims& dims, const MoeArgs& args, const Parallel& par, const OpsIsa& isa);

}  // namespace ortllm
