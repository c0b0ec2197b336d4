// Pure QLinear kernel: a block-quantized projection with the LoRA, the block offsets and an
// epilogue fused in, batch-invariant by construction.
//
//   x <- RMSNorm(x) * norm_weight first when the op carries the norm (the layer's input norm, fused)
//   y[t, n] = epilogue( lora_j(t, n)                       (LoRA of segment j holding n, a = adapter[t])
//                       + sum_b d[n,b] * dx[t,b] * (isum_b(q_w[n], q_x[t]) - zp * qsum_b(q_x[t]))
//                       + m[n,b] * sx[t,b] )                                (block offsets, optional)
//
// W is [N, K] with K in blocks of bs (32, 64, 128 or 256; K zero-padded to kb = ceil(K / bs) blocks):
// int4 codes q_w in 0..15 with zero point zp = 8 (w = d * (q - 8) + m: Q4_0 without m, Q4_1 with
// m = Q4_1's min + 8d), or int8 codes in -128..127 with zp = 0 (Q8_0). d and m are fp16 per
// (row, block). Activations are quantized once per (token, block) to int8: dx = absmax / 127,
// q_x = rint(x / dx), qsum = sum of the block's codes, sx = dx * qsum; the integer dot isum is exact.
// mxfp4 (QLinearDims::mxfp4, bits 4, ops ABI 18: gpt-oss's MXFP4 experts kept exact): the 4-bit code indexes a
// table instead of an affine level, w = kMxfp4Table[q] * d with kMxfp4Table = 2 x e2m1 = {0, 1, 2, 3, 4, 6, 8, 12,
// -0, -1, ..., -12} (int8; llama.cpp's kvalues_mxfp4) and d = 2^(e - 128) the block's e8m0 exponent as fp16, no m. The
// kernels read the table biased to unsigned bytes, kMxfp4Table[q] + 12 in 0..24, as the affine int4 path reads its
// codes, with zp = kMxfp4Zero = 12: isum - 12 qsum is the same exact integer sum of table values times activation
// codes, so every path and the float epilogue are the int4 ones (4.5 bits a weight: 4 + one fp16 d per 32).
// act_bits = 16 (int8 weights only: the LM head, and the projections a build names): int16 codes instead,
// dx = absmax / 32767, the integer dot with the int8 codes still exact in int32 (|isum| <= bs * 128 * 32767 < 2^31
// for bs <= 128). The activations' rounding then costs ~1/258 of the int8 form's: an int8 head on int8 activations
// measured +0.0007 held-out KLD against an fp32 head (SmolLM2 prose), most of what the int4 build loses there.
// A LoRA on such a projection shrinks the row's int8 codes (quantized as above, beside the int16 ones), so its
// term is the one an act_bits 8 call adds.
//
// Packed layout (pipeline/qlinear_pack.py packs; the NumPy unpacker there is what the reference
// uses): rows in groups of 8 (N padded to N_pad = 8 * G with zero rows),
//   codes  [G, kb, bs * bits]   per (group, block): bs / 32 sub-blocks of 32 elements x 8 rows;
//          int4: 4 chunks of 32 bytes per sub-block; chunk j holds, for row r, bytes [4r, 4r + 4)
//                whose low nibbles are elements 8j..8j+3 and high nibbles 8j+4..8j+7;
//          int8: 8 chunks of 32 bytes; chunk i holds, for row r, elements 4i..4i+3 at [4r, 4r + 4)
//   d, m   [G, kb, 8]           fp16 bits, row r of the group in lane r
// so one 32-byte load feeds 8 output rows, each 32-bit lane a different row: the integer dot of
// 8 rows with one broadcast word of x needs no horizontal reduction, and one fp16x8 load gives
// the 8 rows' scales of a block.
//
// LoRA on int8 stacks, as integer dots on the activation codes above (rank r = rank_j[a], slot a):
//   shrink  h[r] = sum_c fma chain over the 32-element chunks c of K, in order:
//                  (dx[t, block of c] * sA[a, c, r]) * isum_c(q_x[t], qA[a][:, r])
//   quantize h once per (token, segment) to int8: dh = absmax_r / 127, qh = rint(h / dh) (0 past r)
//   expand  lora_j(t, n) = ((lscale[a] * dh) * sB[a, n - n0_j]) * isum(qh, qB[a][:, n - n0_j]): the value
//           the base's float accumulation starts from (0 without a LoRA)
// qA int8 [K, r] with an fp16 scale per (32-chunk of K, column i), stored in k-quads: code (k, i) at byte
// (k / 4 * r + i) * 4 + k % 4, so a 32-byte load holds 4 k of 8 ranks, one rank per 32-bit lane, and a
// broadcast word of 4 activation codes feeds 8 ranks' dots as in the base (K a multiple of 4). qB int8
// [r, N_j] with an fp16 scale per (slot, column), stored in rank quads: code (r, n) at byte
// (r / 4 * N_j + n) * 4 + r % 4, so a 32-byte load holds 4 ranks of 8 columns, one column per 32-bit lane, and
// a broadcast word of 4 h codes feeds their dots as the shrink's does (r_max a multiple of 4). Both are
// products of int8 codes, 4 to a 32-bit lane: one dpbusd, or maddubs + madd on AVX2. Shrink and expand
// run together per up to kQTile tokens of one slot before the projection (one shrink over the segments where the
// slot has a rank, their A read side by side in one pass over the codes; then one expand per segment), into a
// [T, N_j] buffer the projection's epilogue adds: each load of A and B serves all the tokens. The integer sums are
// exact (|isum_c| <= 32 * 127^2, |isum| <= r * 127^2), so only the float steps above order the result, the same
// on every path. Against the float LoRA (fp32 x, the adapter's float32 A and B) the LoRA term is within ~1%
// rms: activation codes, A, h and B each ~0.5% (tests/custom_ops).
//
// Mixes (a token with several terms, ops ABI 14): each term (token, k) is shrunk, quantized and expanded exactly as a
// one-adapter token of its slot would be, but with coef = (lscale * w_k) * dh, into its own layer k of the LoRA
// buffer; then the token's terms are added in k order, per segment over the terms with a rank there (the first one
// taken as it is, so a one-term row is the one-adapter value), into layer 0, which the projection starts from. The
// order of the adds is the row's own (the caller fixes its terms' order per request), so a mixed row gets the same
// bits alone or in any batch, on every ISA table (the adds are the driver's). DoRA slots are not mixed (the op
// refuses them in a row with several terms or a weight other than 1).
//
// DoRA rows (PEFT use_dora): a slot flagged in `dora` carries a per-output scale g = m / ||W + s B A||_row (the
// magnitude over the norm of each output's merged weight row, precomputed when the adapter is added); such a row's
// value is multiplied by g[n] before the epilogue: y = epilogue(g * (x W^T + lora)). Segments where the slot's rank
// is 0 keep scale 1; rows of other slots (plain LoRA, -1) are not touched.
//
// Batch invariance: every output y[t, n] is computed by the same sequence of operations whatever
// T, the token tile, the thread split or the caller's chunking: integer sums are exact; the LoRA
// term (its fma chain over the chunks of K, one quantization of h per token, two multiplies) seeds
// the accumulator, then per block one fma(d * dx, isum', acc) and one fma(m, sx, acc) in block
// order, then the epilogue. The scalar path uses std::fma in the same order as the AVX2 path, so
// both ISAs give the same bits too (but for the exp of the gated epilogues' sigmoid).
#pragma once
#include <cstdint>

#include "parallel.h"

namespace ortllm {

// kSwiGLU: SiLU(gate) * up; kGeGLU: GELU-tanh(gate) * up (Gemma), gate = y[:, :N/2], up = y[:, N/2:]: "gated".
enum class QLinearEpilogue { kNone, kResidual, kSwiGLU, kGeGLU };
constexpr bool is_gated(QLinearEpilogue e) {
  return e == QLinearEpilogue::kSwiGLU || e == QLinearEpilogue::kGeGLU;
}
// GELU-tanh as g * sigmoid(g * (kGeluA + kGeluB * g^2)): 2 sqrt(2 / pi) and 0.044715 times it (QLinearIsa::gelu_mul8)
constexpr float kGeluA = 1.5957691216057308f;
constexpr float kGeluB = 0.07135481627159526f;

constexpr int kQLinearMaxBlock = 256;  // elements of K a block may hold (the kernels' staging buffers are sized by it)
constexpr int kQLinearMaxBlock16 = 128;  // the same with act_bits 16: |isum| <= bs * 128 * 32767 < 2^31
constexpr int kQLinearMaxSegments = 3;   // LoRA targets sharing one fused weight (q|k|v)
constexpr int kQLinearMaxOutputs = 3;    // epilogue "none": y split along N into up to 3 outputs (q, k, v)
constexpr int kQLinearArgmaxOutput = 3;  // the op's optional int64 output: each row's first maximum (QLinearArgs)

constexpr int kLoraChunk = 32;       // elements of K per fp16 scale of A
constexpr int kQLinearMaxTerms = 4;  // adapters one token may mix (token_adapter's second extent)
// Software prefetch distances of the LoRA kernels (lora_shrink, lora_expand on AVX2 and VNNI). Each quad reads its
// slot's A (one linear run, ~9 KB at rank 16) and B (rank / 4 rows of width * 4 bytes, read 32 or 64 bytes of every
// row per column chunk: short strided streams the hardware prefetcher barely trains on), cold: a step streams 84 MB
// of weights between two reads of a layer's stacks. Paired steps, 4 adapters of rank 16 at B = 16 (alternating,
// 2 rounds, B then in rank pairs): the LoRA's cost +1.24-1.29 ms without, +0.96-1.04 ms with B's prefetch alone,
// +0.82-0.87 ms with both.
constexpr int kLoraPrefetchA = 1024;  // bytes of A ahead of the k-quad being read
constexpr int kLoraPrefetchB = 64;    // columns of B ahead, in each rank quad's row (4 cache lines)

// mxfp4's values by 4-bit code (2 x e2m1), and the bias that makes them unsigned bytes for the integer dots.
constexpr int8_t kMxfp4Table[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr int kMxfp4Zero = 12;

struct QLinearLoraSegment {
  const int8_t* A;          // [n_slots, K, r_max] codes in k-quads (packed_a: slot s holds [K, rank[s]])
  const uint16_t* A_scale;  // [n_slots, ceil(K / 32), r_max] fp16 bits (packed_a: [kc, rank[s]] first)
  const int8_t* B;          // [n_slots, r_max, width] codes in rank quads
  const uint16_t* B_scale;  // [n_slots, width] fp16 bits
  const int32_t* rank;      // [n_slots], 0..r_max (0: the slot leaves this segment alone)
  int64_t r_max;            // a multiple of 4 (B's rank quads)
  int64_t col0, width;      // the segment's output columns [col0, col0 + width)
};

struct QLinearDims {
  int64_t num_tokens;  // T
  int64_t in_dim;      // K
  int64_t out_dim;     // N (rows of W; the output has N, or N / 2 with a gated epilogue)
  int64_t block_size;  // bs, a multiple of 32
  int bits;            // 4 or 8
  QLinearEpilogue epilogue;
  int act_bits = 8;    // 8, or 16 (bits == 8 only; a LoRA still shrinks the row's int8 codes)
  bool mxfp4 = false;  // bits 4, the codes index kMxfp4Table (act_bits 8, no block offsets)
  int zero_point() const { return mxfp4 ? kMxfp4Zero : bits == 4 ? 8 : 0; }
  int64_t groups() const { return (out_dim + 7) / 8; }
  int64_t k_blocks() const { return (in_dim + block_size - 1) / block_size; }
  bool gated() const { return is_gated(epilogue); }
  int64_t y_cols() const { return gated() ? out_dim / 2 : out_dim; }
};

struct QLinearArgs {
  const float* x;            // [T, K]
  const float* norm_weight;  // [K] or nullptr: the projection multiplies RMSNorm(x) * norm_weight
  float norm_eps;
  const uint8_t* codes;   // [G, kb, bs * bits]
  const uint16_t* d;      // [G, kb, 8] fp16 bits
  const uint16_t* m;      // [G, kb, 8] fp16 bits, or nullptr (no block offsets)
  const float* residual;  // [T, N] with kResidual (may alias y), else nullptr
  // LoRA (token_adapter == nullptr: none). A token mixes up to adapter_terms adapters (ops ABI 14): term k of token
  // t is slot token_adapter[t * adapter_terms + k] (-1: none; a row's -1s come after its slots) with weight
  // adapter_weight[same index] (nullptr: every weight 1), and the token's LoRA term is the sum over its terms, in k
  // order, of w_k * lscale[slot_k] * (x A_k) B_k (each term computed as one adapter's, its coef = (lscale * w) * dh;
  // qlinear.cc, plan_lora / merge_terms). One term of weight 1 is the one-adapter LoRA, bit for bit.
  const int32_t* token_adapter;  // [T, adapter_terms], -1 or a slot
  int64_t adapter_terms = 1;     // M, 1..kQLinearMaxTerms
  const float* adapter_weight;   // [T, adapter_terms] finite weights, or nullptr
  const float* lora_scale;       // [n_slots]
  int64_t n_slots;
  bool packed_a;
  int n_segments;
  QLinearLoraSegment seg[kQLinearMaxSegments];
  // DoRA (nullptr: none): dora[s] != 0 marks slot s as DoRA; dora_scale[j] [n_slots, seg[j].width] its per-output
  // scale on segment j's columns (read where the slot's rank on segment j is > 0).
  const int32_t* dora;
  const float* dora_scale[kQLinearMaxSegments];
  float* y;       // [T, y_cols], or with n_outputs > 1 (epilogue kNone only):
  int n_outputs;  // outputs[j] [T, out_width[j]] = columns [out_col0[j], + out_width[j]) of y
  float* outputs[kQLinearMaxOutputs];
  int64_t out_col0[kQLinearMaxOutputs], out_width[kQLinearMaxOutputs];
  // [T] or nullptr (epilogue kNone, one output): argmax[t] = the column of y's first maximum in row t, found by
  // each work item on the columns it just wrote (in L1) and merged in column order: the engine's greedy rows
  // need no pass over the logits. Rows holding a NaN give an unspecified column.
  int64_t* argmax;
};

struct OpsIsa;
// isa: the session's row of the ISA registry (isa.h); every row gives the same bits.
void qlinear(const QLinearDims& dims, const QLinearArgs& args, const Parallel& par, const OpsIsa& isa);

// ---- ISA table (qlinear_scalar.cc, x86/qlinear_*.cc); plain pointers, used by qlinear.cc.

// One 8-row group's weights, as the micro-kernel reads them.
struct QGroup {
  const uint8_t* codes;  // [kb, bs * bits]
  const uint16_t* d;     // [kb, 8]
  const uint16_t* m;     // [kb, 8] or nullptr
  int kb, bs, bits;
  bool mxfp4 = false;  // the codes index kMxfp4Table (bits 4): QLinearIsa::group_dot_mxfp4 reads the group
};

// One token's activation codes as the LoRA shrink reads them.
struct QLoraToken {
  const int8_t* q;      // [kb * bs] codes
  const float* dx;      // [kb] per-block scales
  const int32_t* qsum;  // [ceil(K / 32)] sums of the codes per 32-chunk
};

// nt consecutive quantized tokens: row t at q + t * q_stride (q16 with act_bits 16), dx/zsum/sx + t * kb.
struct QTokens {
  const int8_t* q;
  const int16_t* q16;
  int64_t q_stride;     // kb * bs
  const float* dx;      // per (token, block) activation scale
  const int32_t* zsum;  // zp * qsum
  const float* sx;      // dx * qsum
  // act_bits 16, for QLinearIsa::group_dot2_16 (else nullptr): each int16 code split into bytes, rows at q_stride:
  // q16 = 256 * q16_hi + q16_lo, q16_lo in 0..255, q16_hi in -128..127.
  const uint8_t* q16_lo = nullptr;
  const int8_t* q16_hi = nullptr;
  const int32_t* q16_hi_sum = nullptr;  // with q16_hi: each block's sum of the high bytes, [kb] a token (as dx)
  // The same int8 codes by tiles of kCodeTile tokens (QLinearIsa::tiled_codes, act_bits 8): the tile holding this
  // token and the kCodeTile - 1 after it, [kb][kCodeTile][bs] (block b of its row t at (b * kCodeTile + t) * bs), so
  // a block's codes of all the tile's tokens are one run of kCodeTile * bs bytes. nullptr where this token does not
  // start a tile of the call (or the table does not ask for them).
  const int8_t* q_tiles = nullptr;
  // With q_tiles: the tile's dx and sx by block, [kb][kCodeTile] (token t's of block b at b * kCodeTile + t), so a
  // block's float step reads its tokens' scales at fixed offsets from one pointer.
  const float* dx_tiles = nullptr;
  const float* sx_tiles = nullptr;
  // With q_tiles and int8 weights: the tile's code sums by block, [kb][kCodeTile] as dx_tiles (zsum is zp * qsum, 0
  // there; VNNI's panel GEMM biases int8 weights to unsigned and takes 128 * qsum back off).
  const int32_t* qsum_tiles = nullptr;
};

constexpr int kCodeTile = 16;  // tokens of a tile of QTokens::q_tiles (an AMX A tile's rows)

constexpr int kQTile = 4;           // tokens per micro-kernel call (weights unpacked once for them)
constexpr int kDotTileMax = 16;     // tokens a group_dot2 call may take (QLinearIsa::dot2_tokens, at most this)
constexpr int kGemmTokensMax = 64;  // tokens a paired gemm call may take (QLinearIsa::gemm_tokens, at most this)

// One segment's shrink for the tokens of a LoRA quad: its slot's A in k-quads with lda ranks a quad
// (A[(k / 4 * lda + r) * 4 + k % 4]), the fp16 scales sA[c * lda + r], and h[t] [rank] the token's output row.
struct QLoraShrink {
  const int8_t* A;
  const uint16_t* sA;
  int lda, rank;
  float* h[kQTile];
};

struct QLinearIsa;

// One call of QLinear's multi-token GEMM entry (QLinearIsa::gemm). The driver (qlinear.cc project) cuts each work
// item into these tiles and makes every blocking decision (which groups go together, how many tokens, whether the
// two-group kernel pays); the entry computes the tile: out0 [nt, 8] (and out1 with two groups) accumulate from their
// values (0, or the tokens' LoRA terms) the base projection of w0's (and w1's) 8 rows for tokens x .. x + nt - 1.
struct QGemmTile {
  QGroup w0, w1;  // w1: the second group (a neighbour, or a gated epilogue's up group), groups == 2 only
  int groups;     // 1 or 2
  bool paired;    // one two-group kernel call (nt <= dot2_tokens); false: the one-group kernels on each group
  bool act16;     // act_bits 16: x.q16 (and x.q16_lo / q16_hi when paired)
  QTokens x;      // the tile's first token
  int nt;         // tokens: <= dot2_tokens (or gemm_tokens, where larger) when paired, else any
  float* out0;
  float* out1;
};

// The tokens of x from the i-th on (kb: the weight's blocks per row); q_tiles stays only where i is a multiple of
// kCodeTile.
QTokens advance_tokens(const QTokens& x, int i, int kb);

// QLinearIsa::gemm by the table's group_dot / group_dot2 entries (every table's today): a new table may give its
// own (e.g. a blocked kernel sweeping a panel with many tokens) as long as it keeps the bits.
void gemm_by_group_dots(const QLinearIsa& isa, const QGemmTile& tile);

struct QLinearIsa {
  const char* name;
  // x[0:K] -> q[0:kb*bs] (zero past K), dx[kb], qsum[kb].
  void (*quantize_row)(const float* x, int K, int bs, int8_t* q, float* dx, int32_t* qsum);
  // out[t * 8 + r] (t < nt <= kQTile): the base projection of the group's 8 rows for nt tokens, its float
  // accumulation starting from out's value (0, or the token's LoRA term on those outputs).
  void (*group_dot)(const QGroup& g, const QTokens& x, int nt, float* out);
  // group_dot of two groups of one weight (same kb, bs, bits, offsets or none) at once, out0 and out1 as
  // group_dot's out: the same bits as two group_dot calls. nullptr: the driver calls group_dot twice.
  void (*group_dot2)(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0, float* out1);
  // For n <= kQTile tokens of one adapter (sharing each load of A / B) and ns <= kQLinearMaxSegments segments of
  // one input (q, k, v: their A read in one pass over the tokens' codes, as independent chains), r < s[j].rank:
  // s[j].h[t][r] = the fma chain over chunks c of (dx[t][c * 32 / bs] * s[j].sA[c * lda + r]) * isum_c (qlinear.h).
  void (*lora_shrink)(const QLoraToken* x, int n, int K, int bs, const QLoraShrink* s, int ns);
  // out[t][(i / 8) * ostride + i % 8] = (coef[t] * sB[i]) * float(sum_r qh[t][r] * B(r, i)), i < width, over the
  // rank quads p < quads (qh[t] holds 4 * quads codes), B in rank quads (B(r, i) = B[(r / 4 * width + i) * 4 + r % 4]).
  void (*lora_expand)(const int8_t* const* qh, const float* coef, int n, int quads, const int8_t* B, int64_t width,
                      const uint16_t* sB, float* const* out, int64_t ostride);
  // out[i] = silu(g[i]) * u[i], i < 8.
  void (*silu_mul8)(const float* g, const float* u, float* out);
  // out[i] = gelu_tanh(g[i]) * u[i], i < 8: gelu_tanh(g) = 0.5 g (1 + tanh(z)), z = sqrt(2 / pi) (g + 0.044715 g^3)
  // (torch's gelu(approximate="tanh")), computed as g * sigmoid(2 z) (the same function: 0.5 (1 + tanh z) =
  // sigmoid(2 z)) with SiLU's sigmoid, 2 z = g * (a + b g^2), a = 2 sqrt(2 / pi), b = 0.044715 a.
  void (*gelu_mul8)(const float* g, const float* u, float* out);
  // xn = x * 1 / sqrt(mean(x^2) + eps) * w. The sum of squares is in double over 8 interleaved partial sums
  // (partial k % 8 takes x[k]^2, exact in double; independent chains, not one latency-bound chain) combined in a
  // fixed order: the same bits on every path and for a row whatever the batch.
  void (*rms_norm_row)(const float* x, int K, const float* w, float eps, float* xn);
  // act_bits 16: x[0:K] -> int16 codes q[0:kb*bs] (zero past K), dx[kb] = absmax / 32767, qsum[kb], rounded half to
  // even as quantize_row; and group_dot for int8 weights on those codes (nt <= kQTile, x.q16), the same float
  // epilogue per block: fma(d * dx, isum - zsum, acc), fma(m, sx, acc).
  void (*quantize_row16)(const float* x, int K, int bs, int16_t* q, float* dx, int32_t* qsum);
  void (*group_dot16)(const QGroup& g, const QTokens& x, int nt, float* out);
  // The tokens one group_dot2 call takes (nt <= dot2_tokens; group_dot and group_dot16 take kQTile): the AMX
  // table's tile holds 16.
  int dot2_tokens = kQTile;
  // group_dot2 for act_bits 16 (int8 weights, QTokens::q16_lo / q16_hi, which the driver then writes once a call),
  // up to dot2_tokens tokens: the same bits as two group_dot16 calls. nullptr: the driver calls group_dot16.
  void (*group_dot2_16)(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0,
                        float* out1) = nullptr;
  // DoRA's multiply, out[r] = v[r] * g[r] for r < 8, into a 32-byte aligned buffer the epilogue then reads (a rounded
  // multiply: the same bits on every table). AVX2's is one aligned 32-byte store: SiLU(gate) * up loads the 8 values
  // with one 32-byte load, which the CPU forwards only from one store covering it (from two halves or eight floats
  // the load waits for them to reach L1: +30% on SmolLM2's gate|up with 16 DoRA rows).
  void (*mul8)(const float* v, const float* g, float* out) = nullptr;
  // group_dot for an mxfp4 group (QGroup::mxfp4; nt <= kQTile): each code through kMxfp4Table + kMxfp4Zero, then
  // the int4 path's operations (x.zsum = 12 qsum); group_dot2_mxfp4 two such groups as group_dot2 pairs affine ones
  // (nullptr: the driver never pairs mxfp4 groups). A table without its own takes the ones it was copied from
  // (avx512vnni and amx run AVX2's; AMX's tiles stay for affine codes).
  void (*group_dot_mxfp4)(const QGroup& g, const QTokens& x, int nt, float* out) = nullptr;
  void (*group_dot2_mxfp4)(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0,
                           float* out1) = nullptr;
  // The multi-token GEMM over one tile (QGemmTile): the driver's only call into the projection's micro-kernels.
  void (*gemm)(const QLinearIsa& isa, const QGemmTile& tile) = gemm_by_group_dots;
  // The tokens a paired gemm call takes (0: dot2_tokens; at most kGemmTokensMax): a table whose gemm sweeps a panel of
  // weights with many tokens (AMX: the two groups' weights unpacked once for a work item's 64 tokens) takes more than
  // one dot2 call.
  int gemm_tokens = 0;
  // Whether the driver gives the gemm QTokens::q_tiles (a copy of the codes by tiles of kCodeTile tokens) when it
  // pairs: AMX's A tiles then load one run a block instead of kCodeTile rows a K-row apart.
  bool tiled_codes = false;
};

const QLinearIsa& qlinear_scalar_isa();  // the portable table; the others are the architecture's (isa.h)

}  // namespace ortllm
