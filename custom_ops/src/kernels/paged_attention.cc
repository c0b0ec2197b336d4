// PagedAttention kernel (pure; see paged_attention.h for the argument shapes).
//
// What it computes, per call with T new tokens from S sequences:
//   1. for every new token t of sequence s (slot p = context_lens[s] + t - cu_seqlens[s]):
//        q_t, k_t <- RoPE at positions[t];  quantized + rotate: q_t, k_t <- H q_t / sqrt(D) per head
//        K/V rows of every kv head -> cache block block_tables[s][p / BS], offset p % BS
//        (fp32 copied; fp16 rounded to nearest even; int8 / fp8 / int4 quantized per (token, head) with one
//        fp16 scale; V rotated only in an int4 cache, where 4 bits need the outlier channels spread too, and
//        rotated back in the output)
//   2. for every new token t and query head h (kv head g = h / (H / Hkv)):
//        out[t, h] = softmax_j(scale * q_t,h . K[s, g, j]) @ V[s, g, :],  j = 0 .. p(t)  (causal; with a
//        sliding window W, j = p(t) - W + 1 .. p(t): the keys before are masked like the future ones, and
//        spans no row of an item can see are skipped, which leaves every row's bits as they would be)
//      read back from the cache (so new tokens see exactly what later steps will see).
//      With sinks (gpt-oss): softmax over the keys and one more logit sinks[h] that weights no value, i.e. the
//      denominator gains e^sinks[h]; merged into the row's state after all its parts (add_sink), on every path.
//      int8 caches: q_t,h is quantized like a key row (int8 codes, one fp16 scale per row) and
//      q . k is an exact integer dot of the codes times the two scales (llama.cpp likewise quantizes
//      q to the K cache's dot type); P V likewise, with each row's weights P_j * scale_j quantized to int16
//      per span of keys. 2-4x the multiply-adds per instruction of fp32, and the same bits on every path,
//      since an integer sum has no rounding order. int4 caches: the same dots, on a block's codes unpacked
//      to int8 in L1 (half the bytes of int8 from memory: decode at long context streams the cache).
// Why this way:
//   - Work item = (sequence, tile of up to kTileTokens query tokens, a range of kv heads: as many as fit
//     in kItemRows query rows). The G = H/Hkv query heads sharing a kv head and all tokens of the tile
//     are that head's rows, so every K/V block is loaded (int8: read by integer dots; fp8: widened to
//     floats into a one-block scratch) once per item and used by tile * G queries: decode tokens get G
//     rows per kv head, prefill tiles up to 16 * G (blocked prefill: [rows, D] x [D, span] score tiles).
//     One item reads all its kv heads of a block together: a block's heads are contiguous in the cache
//     ([NB, Hkv, BS, D]), so a sequence whose blocks are consecutive (the pool hands them out in order)
//     streams its cache linearly, where one item per kv head read 4 KB pieces 12 KB apart (measured:
//     half the read bandwidth). Items run on the session pool, longest first.
//   - Online softmax over spans of kSpanKeys keys (several cache blocks; running max m, sum l,
//     rescaled accumulator O) in fp32, so no [T, context] score matrix is ever materialized, decode
//     at context 2048 streams the cache once, and the per-row bookkeeping is amortized over 64 keys.
//   - Keys inside a span are in position order, so the causal mask of a row is a prefix length.
//   - Batch invariance: every row's keys are cut into the same parts of kPartKeys keys from key 0
//     (part_blocks below), each part with its own online-softmax state, and the parts are merged in
//     order by one function (merge_part), whether they ran one after another inside the row's item or
//     as separate items in parallel (a call with few items splits its long items along the keys:
//     "flash-decoding"). So a row gets the same bits alone, in any batch, and as any row of any tile.
#include "paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "isa.h"
#include "stream_prefetch.h"
#include "vec.h"

namespace ortllm {
namespace {

constexpr int64_t kTileTokens = 16;
constexpr int64_t kItemRows = 64;  // query rows an item takes by grouping kv heads (see plan_items)
constexpr int64_t kSpanKeys = 64;  // keys per online-softmax step (<= 64 blocks of size >= 1)

// Every row's keys are processed in parts of kPartKeys keys (whole spans, from key 0), merged in order.
// When a call has fewer than kMinItems items (B = 1: one), items are split along the parts and, if that
// is not enough, along the kv heads; the parts' states are merged after the parallel section.
constexpr size_t kMinItems = 8;
constexpr int64_t kPartKeys = 256;

// A call whose items see fewer than this many (query row, key) pairs in all runs on the calling thread:
// B = 1 decode (9 query heads) up to context ~280, i.e. while its keys are one part. Waking the pool costs
// ~3 us on an idle machine and far more on a busy one (measured: 34 us per call at context 64 on 2 threads
// vs 9 us on 1), while such a call's attention is a few microseconds. Threads do not change the bits.
constexpr int64_t kSerialWork = 2560;
// Tokens from which writing the new K/V rows (RoPE, Hadamard, quantization) goes to the pool. A token's rows
// take ~2.5 us in the engine (12 ropes and Hadamard transforms, 15 quantizations, and the cache lines they
// write are cold), a parallel section ~0.6 us, and the pool's other thread is spinning anyway, having just
// run the q|k|v projection: a B = 16 decode step spent ~10% of its time writing on one thread (measured).
constexpr int64_t kParallelTokens = 2;

// fp16 caches: a tile with at least this many query rows per kv head widens each (block, kv head) of fp16 rows
// into an L1 scratch once (vec.h widen_f16) for its fp32 dots; one with fewer has its dots read the fp16 rows in
// place (scores_f16, pv_f16), with no second pass over the block. The same bits either way (vec.h: for D % 8 == 0;
// other head sizes always widen). One node, SmolLM2 shapes, fp16, 1 thread, in place vs widened (us per call):
// decode B = 1 at context 2048 (3 rows) 155 vs 252, 4 x 2-token verify (6 rows) 850 vs 1074, 4 tokens 1879 vs 2029,
// 8 tokens (24 rows) 3758 vs 3818; a 16-token prefill tile (48 rows) widened is 1-3% faster (prefill 512).
constexpr int64_t kF16WidenRows = 32;

// Cache blocks per span of keys and per part (a whole number of spans: kPartKeys keys when the block size
// divides 64, else the nearest whole number of spans below it, at least one).
int64_t span_blocks(int64_t BS) {
  return std::max<int64_t>(1, kSpanKeys / BS);
}
int64_t part_blocks(int64_t BS) {
  const int64_t nsub = span_blocks(BS);
  return std::max<int64_t>(1, kPartKeys / (nsub * BS)) * nsub;
}

struct WorkItem {
  int32_t seq, t0, t1;            // query tokens [t0, t1) of the sequence (relative to cu_seqlens[seq])
  int32_t g0, g1;                 // kv heads [g0, g1)
  int64_t cost;                   // query rows x keys
  int64_t part0 = 0, part1 = -1;  // parts [part0, part1) of the keys (-1: all the last row needs)
  // Pieces of a split item: the part states of the split item's rows, [nparts][rows][D + 2] (unnormalized O,
  // m, l per row), of which this piece writes rows [row0, row0 + its rows) of parts [part0, part1).
  float* partial = nullptr;
  int64_t split_rows = 0, row0 = 0;
};

// Per-thread scratch, grown on demand and kept from call to call (the session's pool threads and the
// calling thread live as long as the session): a decode call takes ~10 us, and its heap allocations were
// a visible share of that. Contents are never carried over: every user writes before it reads.
enum class ScratchUse { kRow, kItem, kCount };
float* thread_scratch(ScratchUse use, size_t n) {
  thread_local std::vector<float> bufs[static_cast<int>(ScratchUse::kCount)];
  std::vector<float>& b = bufs[static_cast<int>(use)];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// int8 and int4 caches: q . k and P V as integer dots (query codes . key codes, int16 weights . value codes).
bool int_dots(KvDtype kv) {
  return kv == KvDtype::kInt8 || kv == KvDtype::kInt4;
}

struct Ctx {
  const PagedAttentionDims* d;
  const PagedAttentionArgs* a;
  const int32_t* token_seq;  // [T]
  float* q_work;             // [T, H*D] roped (and rotated) queries
  // int8 / int4 caches: each query row's int8 codes [T, H*D] and qmul [T, H] (scale x the row's fp16 scale), made
  // once per call in phase 1: a split decode item's pieces (8 at context 2048) would each quantize all its rows
  int8_t* q_codes;
  float* q_mul;
  const WorkItem* items;
  const VecOps* vec;
};

// Phase 1: one token: rope/rotate its queries into q_work, write its K/V rows into the cache.
void write_token(void* usr, size_t ti) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  const PagedAttentionDims& d = *c.d;
  const PagedAttentionArgs& a = *c.a;
  const int64_t t = static_cast<int64_t>(ti);
  const int64_t D = d.head_size, H = d.num_heads, Hkv = d.kv_heads, BS = d.block_size;
  const int32_t s = c.token_seq[t];
  const int64_t p = a.context_lens[s] + (t - a.cu_seqlens[s]);
  const float* cs = a.cos + static_cast<int64_t>(a.positions[t]) * (D / 2);
  const float* sn = a.sin + static_cast<int64_t>(a.positions[t]) * (D / 2);
  const bool int4 = d.kv_dtype == KvDtype::kInt4;
  const int64_t row_bytes = kv_row_bytes(d.kv_dtype, D);
  // One row into the cache: fp32 copied, fp16 rounded (quant.h round_f16), else quantized with its fp16 scale.
  auto store = [&](const float* src, void* cache, uint16_t* scales, int64_t slot) {
    uint8_t* dst = static_cast<uint8_t*>(cache) + slot * row_bytes;
    const int Di = static_cast<int>(D);
    switch (d.kv_dtype) {
      case KvDtype::kFloat32:
        std::memcpy(dst, src, sizeof(float) * D);
        break;
      case KvDtype::kFloat16:
        round_f16(src, Di, reinterpret_cast<uint16_t*>(dst));
        break;
      case KvDtype::kInt8:
        scales[slot] = quantize_int8(*c.vec, src, Di, dst);
        break;
      case KvDtype::kFp8E4M3:
        scales[slot] = quantize_e4m3(*c.vec, src, Di, dst);
        break;
      case KvDtype::kInt4:
        scales[slot] = quantize_int4(*c.vec, src, Di, dst);
        break;
    }
  };

  const bool quantize_queries = int_dots(d.kv_dtype);
  for (int64_t h = 0; h < H; ++h) {
    float* qr = c.q_work + t * H * D + h * D;
    std::memcpy(qr, a.q + t * H * D + h * D, sizeof(float) * D);
    apply_rope(qr, static_cast<int>(D), cs, sn, d.rope_interleaved);
    if (d.rotate) fwht_normalized(*c.vec, qr, static_cast<int>(D));
    if (quantize_queries) {  // the keys' own rounding (quantize_int8: per row, fp16 scale rounded up), for scores_q8
      const uint16_t s16 =
          quantize_int8(*c.vec, qr, static_cast<int>(D), reinterpret_cast<uint8_t*>(c.q_codes + t * H * D + h * D));
      c.q_mul[t * H + h] = d.scale * f16_to_float(s16);
    }
  }

  const int64_t block = a.block_tables[s * d.max_blocks + p / BS];
  float* row = thread_scratch(ScratchUse::kRow, static_cast<size_t>(D));
  for (int64_t g = 0; g < Hkv; ++g) {
    const int64_t slot = (block * Hkv + g) * BS + p % BS;  // row index into [NB*Hkv*BS]
    // key
    std::memcpy(row, a.k + t * Hkv * D + g * D, sizeof(float) * D);
    apply_rope(row, static_cast<int>(D), cs, sn, d.rope_interleaved);
    if (d.rotate) fwht_normalized(*c.vec, row, static_cast<int>(D));
    store(row, a.key_cache, a.key_scales, slot);
    // value: no rope; rotated only in an int4 cache (its outputs are rotated back, finish_row)
    const float* vsrc = a.v + t * Hkv * D + g * D;
    if (int4 && d.rotate) {
      std::memcpy(row, vsrc, sizeof(float) * D);
      fwht_normalized(*c.vec, row, static_cast<int>(D));
      vsrc = row;
    }
    store(vsrc, a.value_cache, a.value_scales, slot);
  }
}

// Phase 2: one (sequence, query tile, kv heads [g0, g1)) item; see the file header. Its rows, head by head:
// r = (g - g0) * hrows + tt * G + hh (kv head g, token tt of the tile, query head g * G + hh).
struct ItemShape {
  int64_t D, H, Hkv, BS, G;
  int64_t g0, nh;             // kv heads [g0, g0 + nh)
  int64_t ntok, hrows, rows;  // tokens, rows per kv head (ntok * G), rows (nh * hrows)
  int64_t tok0;               // first global token of the tile
  int64_t pos0;               // its cache position
  int64_t kv_len;             // keys needed by the last row
  int64_t window;             // > 0: keys a row sees, its own included (sliding window)
  int64_t first_key;          // keys before it are outside every row's window (0 without a window)
  int64_t nsub;               // cache blocks per span of keys
  int64_t span;               // keys per span (nsub * BS)
  int64_t part;               // cache blocks per part (whole spans)
  bool quantized;             // codes with an fp16 scale per row (int8, fp8, int4)
  bool half;                  // fp16 values (no scales): widened to floats a (block, head) at a time, or read in place
  bool f16_in_place;          // fp16 with few rows per kv head: the dots read the cache's fp16 rows (kF16WidenRows)
  bool int_dots;  // int8 and int4 caches: q . k and P V as integer dots (query codes . key codes, int16 weights .
                  // value codes); int4 codes are unpacked to int8 a block at a time first (vec.h unpack_q4)
  bool int4;
  bool unrotate;      // int4 caches with rotate: the values are rotated too, so each output row is rotated back
  int64_t row_bytes;  // bytes of one cached row (quant.h kv_row_bytes)
  bool stream;        // decode rows (one token): each K/V row is read once a step, prefetched by prefetch_block
};

ItemShape item_shape(const PagedAttentionDims& d, const PagedAttentionArgs& a, const WorkItem& it) {
  ItemShape sh;
  sh.D = d.head_size;
  sh.H = d.num_heads;
  sh.Hkv = d.kv_heads;
  sh.BS = d.block_size;
  sh.G = sh.H / sh.Hkv;
  sh.g0 = it.g0;
  sh.nh = it.g1 - it.g0;
  sh.ntok = it.t1 - it.t0;
  sh.hrows = sh.ntok * sh.G;
  sh.rows = sh.nh * sh.hrows;
  sh.tok0 = a.cu_seqlens[it.seq] + it.t0;
  sh.pos0 = a.context_lens[it.seq] + it.t0;
  sh.kv_len = a.context_lens[it.seq] + it.t1;
  sh.window = d.window;
  sh.first_key = d.window > 0 ? std::max<int64_t>(0, sh.pos0 - d.window + 1) : 0;
  // Keys are processed kSpan at a time (several cache blocks), so the per-row softmax bookkeeping
  // (max, rescale of O) is amortized over kSpan keys, not block_size.
  sh.nsub = span_blocks(sh.BS);
  sh.span = sh.nsub * sh.BS;
  sh.part = part_blocks(sh.BS);
  sh.quantized = kv_has_scales(d.kv_dtype);
  sh.half = d.kv_dtype == KvDtype::kFloat16;
  sh.f16_in_place = sh.half && sh.D % 8 == 0 && sh.hrows < kF16WidenRows;
  sh.int4 = d.kv_dtype == KvDtype::kInt4;
  sh.int_dots = int_dots(d.kv_dtype);
  sh.unrotate = sh.int4 && d.rotate;
  sh.row_bytes = kv_row_bytes(d.kv_dtype, sh.D);
  sh.stream = sh.ntok == 1;
  return sh;
}

// scratch: Qb [rows, D] | O [rows, D] | S [rows, span] | m [rows] | l [rows] | Kb, Vb [BS, D] (fp8, fp16: widened
//          floats; int4: unpacked int8 codes)
//          | the merged parts: A [rows, D] | M [rows] | L [rows]
//          | int8 caches: qmul [rows] | wscale [rows] | the queries' codes Qc [rows, D] int8
//            | the span's weights' codes Wc [rows, span] int16
// (uninitialized: load_queries and start_part set what is read before it is written)
struct ItemScratch {
  float *Qb, *O, *S, *m, *l, *Kb, *Vb, *A, *M, *L, *qmul, *wscale;
  int8_t* Qc;
  int16_t* Wc;

  explicit ItemScratch(const ItemShape& sh) {
    const int64_t qc_floats = (sh.rows * sh.D + 3) / 4, wc_floats = (sh.rows * sh.span + 1) / 2;
    Qb = thread_scratch(ScratchUse::kItem, static_cast<size_t>(sh.rows * (3 * sh.D + sh.span + 6) + 2 * sh.BS * sh.D +
                                                               qc_floats + wc_floats));
    O = Qb + sh.rows * sh.D;
    S = O + sh.rows * sh.D;
    m = S + sh.rows * sh.span;
    l = m + sh.rows;
    Kb = l + sh.rows;
    Vb = Kb + sh.BS * sh.D;
    A = Vb + sh.BS * sh.D;
    M = A + sh.rows * sh.D;
    L = M + sh.rows;
    qmul = L + sh.rows;
    wscale = qmul + sh.rows;
    Wc = reinterpret_cast<int16_t*>(wscale + sh.rows);
    Qc = reinterpret_cast<int8_t*>(Wc + sh.rows * sh.span);
  }
};

// The merge of a row's parts starts from M = -inf, L = 0, A = 0.
void start_merge(int64_t rows, int64_t D, float* A, float* M, float* L) {
  std::fill(M, M + rows, -std::numeric_limits<float>::infinity());
  std::fill(L, L + rows, 0.f);
  std::fill(A, A + rows * D, 0.f);
}

// Merges one part's state (O unnormalized, m, l) of one row into the running (A, M, L):
//   M' = max(M, m), L = L e^(M - M') + l e^(m - M'), A = A e^(M - M') + O e^(m - M').
// The one merge for every path (parts inside an item, parts of a split item after the parallel section),
// in part order, so a row's bits do not depend on the plan. A part the row sees no key of (m = -inf,
// l = 0, O = 0) leaves the state as it is. Plain baseline-ISA code: no fused multiply-add, whichever
// caller it is inlined into.
void merge_part(int64_t D, const float* O, float m, float l, float* A, float& M, float& L) {
  const float mx = std::max(M, m);
  if (mx == -std::numeric_limits<float>::infinity()) return;  // neither has seen a key yet
  const float wa = std::exp(M - mx), wo = std::exp(m - mx);
  L = L * wa + l * wo;
  for (int64_t x = 0; x < D; ++x) A[x] = A[x] * wa + O[x] * wo;
  M = mx;
}

// A sink logit (attention sinks, gpt-oss) into a row's merged state: one more term of the denominator, weighting no
// value: M' = max(M, sink), L = L e^(M - M') + e^(sink - M'), A = A e^(M - M'). Plain baseline-ISA code, as merge_part.
void add_sink(int64_t D, float sink, float* A, float& M, float& L) {
  const float mx = std::max(M, sink);
  const float wa = std::exp(M - mx);
  L = L * wa + std::exp(sink - mx);
  for (int64_t x = 0; x < D; ++x) A[x] = A[x] * wa;
  M = mx;
}

// out row <- A / L (L >= 1: the row's own key is always valid), then, when the values were cached rotated
// (int4 with rotate), H / sqrt(D) once more: the transform is its own inverse, so sum_j p_j H v_j comes back
// to sum_j p_j v_j.
void finish_row(const VecOps& v, int64_t D, const float* A, float L, float* dst, bool unrotate) {
  const float inv = 1.f / L;
  for (int64_t x = 0; x < D; ++x) dst[x] = A[x] * inv;
  if (unrotate) fwht_normalized(v, dst, static_cast<int>(D));
}

// Where row r of the item goes in [T, H*D] (q_work, out).
int64_t row_offset(const ItemShape& sh, int64_t r) {
  const int64_t gi = r / sh.hrows, rem = r % sh.hrows;
  return (sh.tok0 + rem / sh.G) * sh.H * sh.D + ((sh.g0 + gi) * sh.G + rem % sh.G) * sh.D;
}

// The query head of row r of the item.
int64_t row_head(const ItemShape& sh, int64_t r) {
  return (sh.g0 + r / sh.hrows) * sh.G + (r % sh.hrows) % sh.G;
}

// Qb <- the tile's roped queries of the item's rows (each kv head's G query heads are contiguous); int8 and
// int4 caches instead take each row's int8 codes Qc and qmul, made in phase 1 (Ctx::q_codes), for the integer
// q . k (vec.h scores_q8). A row's codes depend only on the row, so it gets the same scores in any item, tile or
// batch.
void load_queries(const Ctx& c, const ItemShape& sh, ItemScratch& w) {
  for (int64_t r = 0; r < sh.rows; r += sh.G) {
    const int64_t at = row_offset(sh, r);
    if (sh.int_dots) {
      std::memcpy(w.Qc + r * sh.D, c.q_codes + at, static_cast<size_t>(sh.G * sh.D));
      std::memcpy(w.qmul + r, c.q_mul + at / sh.D, sizeof(float) * sh.G);
    } else {
      std::memcpy(w.Qb + r * sh.D, c.q_work + at, sizeof(float) * sh.G * sh.D);
    }
  }
}

// A part's online softmax starts from m = -inf, l = 0, O = 0.
void start_part(const ItemShape& sh, ItemScratch& w) {
  std::fill(w.m, w.m + sh.rows, -std::numeric_limits<float>::infinity());
  std::fill(w.l, w.l + sh.rows, 0.f);
  std::fill(w.O, w.O + sh.rows * sh.D, 0.f);
}

// The cache blocks of one span: nb blocks from key block b0.
struct Span {
  int64_t block[64];  // cache block of each
  int nks[64];        // keys in each block
  int64_t nb;         // blocks in the span
  int nk;             // keys in the span
  int64_t next;       // the cache block after the span's last in the part, -1 if none
};

// Decode items (ItemShape::stream) read each cached K/V row once a step: their blocks' rows are prefetched
// non-temporally one block ahead (nh kv heads of a block lie together: nh * BS rows, and their fp16 scales), so
// the stream goes to L1 without passing through L2, where it evicted what the step reuses (as the projections'
// weights do): a part's first block at its first span, each next block while the one before it is read (the
// last block of a span fetches the next span's first, Span::next). Prefill tiles share blocks between items and
// keep the plain loads. Prefetches never fault. bench/probes/engine_decode.py ART,
// with and without, alternating: --prompt 1984 --cached 210.2 -> 230.6 tok/s (medians of 6, faster in 6 of 6),
// --batch 16 1336.7 -> 1435.2 (4 of 4), --batch 1 306.4 -> 311.7 (4 of 4).
void prefetch_block(const ItemShape& sh, const void* cache, const uint16_t* scales, int64_t block) {
  if (!sh.stream || block < 0) return;
  const int64_t row0 = (block * sh.Hkv + sh.g0) * sh.BS;
  const char* rows = static_cast<const char*>(cache) + row0 * sh.row_bytes;
  const bool t0 = stream_prefetch_t0();  // NTA on AMD (the figures above), T0 on Intel (stream_prefetch.h)
  for (int64_t o = 0; o < sh.nh * sh.BS * sh.row_bytes; o += 64) prefetch_stream(rows + o, t0);
  if (scales != nullptr)
    for (int64_t o = 0; o < sh.nh * sh.BS * 2; o += 64)
      prefetch_stream(reinterpret_cast<const char*>(scales + row0) + o, t0);
}

// The cache block after block sb of the span: the span's next, or the next span's first (-1: the part ends).
int64_t block_after(const Span& sp, int64_t sb) {
  return sb + 1 < sp.nb ? sp.block[sb + 1] : sp.next;
}

// The int8 codes of nk cached rows from row `base` of an int8 or int4 cache: the cache's own bytes (int8), or
// the rows unpacked into `scratch` ([BS, D] floats' room: Kb or Vb) for int4 (vec.h unpack_q4).
const uint8_t* int8_rows(const VecOps& vec, const ItemShape& sh, const void* cache, int64_t base, int nk,
                         float* scratch) {
  const uint8_t* rows = static_cast<const uint8_t*>(cache) + base * sh.row_bytes;
  if (!sh.int4) return rows;
  vec.unpack_q4(rows, nk, static_cast<int>(sh.D), reinterpret_cast<uint8_t*>(scratch));
  return reinterpret_cast<const uint8_t*>(scratch);
}

// Writes the span's scores S [rows, span] = scale * Qb . K, block by block and, in a block, kv head by kv
// head (the order the cache holds them). int8 caches: integer dots of the query codes with the key codes
// (vec.h scores_q8), for any number of rows. fp8 caches: the codes are widened to floats (unscaled) into Kb,
// one (block, head) at a time, so the scratch stays in L1, and the score times the row's scale
// (vec.h scale_columns). fp16 caches: the keys read in place by the fp32 dots (vec.h scores_f16) when the tile
// has few rows per kv head, else widened into Kb the same way (exact), then as fp32 (kF16WidenRows).
void score_span(const Ctx& c, const WorkItem& it, const ItemShape& sh, int64_t b0, int64_t nblocks, ItemScratch& w,
                Span& sp) {
  const PagedAttentionDims& d = *c.d;
  const PagedAttentionArgs& a = *c.a;
  const VecOps& vec = *c.vec;
  const int64_t D = sh.D, BS = sh.BS;
  const int Di = static_cast<int>(D);
  sp.nb = std::min(sh.nsub, nblocks - b0);
  sp.nk = 0;
  const int32_t* table = a.block_tables + it.seq * d.max_blocks;
  for (int64_t sb = 0; sb < sp.nb; ++sb) sp.block[sb] = table[b0 + sb];
  sp.next = b0 + sp.nb < nblocks ? table[b0 + sp.nb] : -1;
  if (b0 % sh.part == 0) {  // a part's first span: nothing fetched its first block ahead
    prefetch_block(sh, a.key_cache, a.key_scales, sp.block[0]);
    prefetch_block(sh, a.value_cache, a.value_scales, sp.block[0]);
  }
  for (int64_t sb = 0; sb < sp.nb; ++sb) {
    prefetch_block(sh, a.key_cache, a.key_scales, block_after(sp, sb));
    sp.nks[sb] = static_cast<int>(std::min(BS, sh.kv_len - (b0 + sb) * BS));
    for (int64_t gi = 0; gi < sh.nh; ++gi) {
      const int64_t base = (sp.block[sb] * sh.Hkv + sh.g0 + gi) * BS;  // first row of this block/head
      float* S = w.S + gi * sh.hrows * sh.span + sb * BS;
      if (sh.int_dots) {
        vec.scores_q8(w.Qc + gi * sh.hrows * D, w.qmul + gi * sh.hrows, static_cast<int>(sh.hrows),
                      int8_rows(vec, sh, a.key_cache, base, sp.nks[sb], w.Kb), a.key_scales + base, sp.nks[sb], Di, S,
                      static_cast<int>(sh.span));
        continue;
      }
      const float* K = static_cast<const float*>(a.key_cache) + base * D;
      if (sh.quantized) {  // fp8 (int8 took the integer path above)
        vec.widen_e4m3(static_cast<const uint8_t*>(a.key_cache) + base * D, sp.nks[sb], Di, w.Kb);
        K = w.Kb;
      } else if (sh.half && sh.f16_in_place) {
        vec.scores_f16(w.Qb + gi * sh.hrows * D, static_cast<int>(sh.hrows),
                       static_cast<const uint16_t*>(a.key_cache) + base * D, sp.nks[sb], Di, d.scale, S,
                       static_cast<int>(sh.span));
        continue;
      } else if (sh.half) {
        vec.widen_f16(static_cast<const uint16_t*>(a.key_cache) + base * D, sp.nks[sb] * Di, w.Kb);
        K = w.Kb;
      }
      vec.scores(w.Qb + gi * sh.hrows * D, static_cast<int>(sh.hrows), K, sp.nks[sb], Di, d.scale, S,
                 static_cast<int>(sh.span));
      if (sh.quantized)
        vec.scale_columns(S, static_cast<int>(sh.hrows), static_cast<int>(sh.span), a.key_scales + base, sp.nks[sb]);
    }
    sp.nk += sp.nks[sb];
  }
}

// Online softmax over the span's scores (causal: row r sees keys up to its own position): the scores
// become e^(s - m_new), O is rescaled by e^(m_old - m_new), l and m updated.
void softmax_span(const VecOps& vec, const ItemShape& sh, int64_t kstart, const Span& sp, ItemScratch& w) {
  const int Di = static_cast<int>(sh.D);
  for (int64_t r = 0; r < sh.rows; ++r) {
    float* sr = w.S + r * sh.span;
    const int64_t qpos = sh.pos0 + (r % sh.hrows) / sh.G;
    const int nvalid = static_cast<int>(std::min<int64_t>(sp.nk, qpos - kstart + 1));
    // sliding window: the span's keys before qpos - window + 1 are masked too
    const int lo = sh.window > 0 ? static_cast<int>(std::clamp<int64_t>(qpos - sh.window + 1 - kstart, 0, sp.nk)) : 0;
    if (nvalid <= lo) {
      std::fill(sr, sr + sp.nk, 0.f);
      continue;
    }
    const float m_new = std::max(w.m[r], vec.max(sr + lo, nvalid - lo));
    const float corr = std::exp(w.m[r] - m_new);  // 0 on the first span (m = -inf)
    const float sum = vec.exp_sum(sr + lo, nvalid - lo, m_new);
    std::fill(sr, sr + lo, 0.f);
    std::fill(sr + nvalid, sr + sp.nk, 0.f);
    if (corr != 1.f) vec.scal(w.O + r * sh.D, Di, corr);
    w.l[r] = w.l[r] * corr + sum;
    w.m[r] = m_new;
  }
}

// int8 caches: O += P V as integer dots. Each row's weights w_j = P_j * scale_j over the whole span are
// quantized to int16 against the span's largest (vec.h weights_q16: half a step is 2^-16 of it, far below the
// int8 values' own step), then every (block, kv head) adds W . codes (exact) times the row's weight scale
// (vec.h pv_q16). Spans are the same keys for a row on every path, so the same bits alone or in any batch.
void accumulate_span_int8(const Ctx& c, const ItemShape& sh, const Span& sp, ItemScratch& w) {
  const PagedAttentionArgs& a = *c.a;
  const VecOps& vec = *c.vec;
  const int64_t D = sh.D;
  for (int64_t sb = 0; sb < sp.nb; ++sb)
    for (int64_t gi = 0; gi < sh.nh; ++gi)
      vec.scale_columns(w.S + gi * sh.hrows * sh.span + sb * sh.BS, static_cast<int>(sh.hrows),
                        static_cast<int>(sh.span), a.value_scales + (sp.block[sb] * sh.Hkv + sh.g0 + gi) * sh.BS,
                        sp.nks[sb]);
  for (int64_t r = 0; r < sh.rows; ++r) w.wscale[r] = vec.weights_q16(w.S + r * sh.span, sp.nk, w.Wc + r * sh.span);
  for (int64_t sb = 0; sb < sp.nb; ++sb) {
    prefetch_block(sh, a.value_cache, a.value_scales, block_after(sp, sb));
    for (int64_t gi = 0; gi < sh.nh; ++gi) {
      const int64_t base = (sp.block[sb] * sh.Hkv + sh.g0 + gi) * sh.BS;
      vec.pv_q16(w.Wc + gi * sh.hrows * sh.span + sb * sh.BS, static_cast<int>(sh.span), w.wscale + gi * sh.hrows,
                 static_cast<int>(sh.hrows), int8_rows(vec, sh, a.value_cache, base, sp.nks[sb], w.Vb), sp.nks[sb],
                 static_cast<int>(D), w.O + gi * sh.hrows * D);
    }
  }
}

// O += P V over the span's blocks, kv head by kv head in a block (fp8 caches: the probabilities times the
// values' scales, times the codes widened into Vb; fp16 caches: the values read in place, or widened into Vb for
// tiles of many rows, as the keys in score_span).
void accumulate_span(const Ctx& c, const ItemShape& sh, const Span& sp, ItemScratch& w) {
  if (sh.int_dots) return accumulate_span_int8(c, sh, sp, w);
  const PagedAttentionArgs& a = *c.a;
  const VecOps& vec = *c.vec;
  const int64_t D = sh.D;
  for (int64_t sb = 0; sb < sp.nb; ++sb) {
    for (int64_t gi = 0; gi < sh.nh; ++gi) {
      const int64_t base = (sp.block[sb] * sh.Hkv + sh.g0 + gi) * sh.BS;
      const float* V = static_cast<const float*>(a.value_cache) + base * D;
      float* P = w.S + gi * sh.hrows * sh.span + sb * sh.BS;
      if (sh.quantized) {
        vec.widen_e4m3(static_cast<const uint8_t*>(a.value_cache) + base * D, sp.nks[sb], static_cast<int>(D), w.Vb);
        V = w.Vb;
        vec.scale_columns(P, static_cast<int>(sh.hrows), static_cast<int>(sh.span), a.value_scales + base, sp.nks[sb]);
      } else if (sh.half && sh.f16_in_place) {
        vec.pv_f16(P, static_cast<int>(sh.span), static_cast<int>(sh.hrows),
                   static_cast<const uint16_t*>(a.value_cache) + base * D, sp.nks[sb], static_cast<int>(D),
                   w.O + gi * sh.hrows * D);
        continue;
      } else if (sh.half) {
        vec.widen_f16(static_cast<const uint16_t*>(a.value_cache) + base * D, sp.nks[sb] * static_cast<int>(D), w.Vb);
        V = w.Vb;
      }
      vec.pv(P, static_cast<int>(sh.span), static_cast<int>(sh.hrows), V, sp.nks[sb], static_cast<int>(D),
             w.O + gi * sh.hrows * D);
    }
  }
}

// A row's state of one part in a split item's `partial`: unnormalized O [D] | m | l.
float* part_state(const WorkItem& it, int64_t D, int64_t part, int64_t r) {
  return it.partial + ((part * it.split_rows) + it.row0 + r) * (D + 2);
}

// Part p of the item is done: keep its state for the merge after the parallel section (split items), or
// merge it into the item's running state now.
void end_part(const ItemShape& sh, const WorkItem& it, int64_t p, ItemScratch& w) {
  const int64_t D = sh.D;
  for (int64_t r = 0; r < sh.rows; ++r) {
    if (it.partial) {
      float* dst = part_state(it, D, p, r);
      std::memcpy(dst, w.O + r * D, sizeof(float) * D);
      dst[D] = w.m[r];
      dst[D + 1] = w.l[r];
    } else {
      merge_part(D, w.O + r * D, w.m[r], w.l[r], w.A + r * D, w.M[r], w.L[r]);
    }
  }
}

// out <- A / L for every row of an item that was not split (its sink merged in first, when there are sinks).
void store_item(const Ctx& c, const ItemShape& sh, ItemScratch& w) {
  for (int64_t r = 0; r < sh.rows; ++r) {
    if (c.a->sinks) add_sink(sh.D, c.a->sinks[row_head(sh, r)], w.A + r * sh.D, w.M[r], w.L[r]);
    finish_row(*c.vec, sh.D, w.A + r * sh.D, w.L[r], c.a->out + row_offset(sh, r), sh.unrotate);
  }
}

void attend_item(void* usr, size_t ii) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  const WorkItem& it = c.items[ii];
  const ItemShape sh = item_shape(*c.d, *c.a, it);
  ItemScratch w(sh);
  load_queries(c, sh, w);
  if (!it.partial) start_merge(sh.rows, sh.D, w.A, w.M, w.L);
  const int64_t nblocks = (sh.kv_len + sh.BS - 1) / sh.BS;
  const int64_t nparts = (nblocks + sh.part - 1) / sh.part;
  const int64_t p1 = it.part1 >= 0 ? it.part1 : nparts;
  Span sp;
  for (int64_t p = it.part0; p < p1; ++p) {
    start_part(sh, w);
    const int64_t end = std::min(nblocks, (p + 1) * sh.part);
    for (int64_t b0 = p * sh.part; b0 < end; b0 += sh.nsub) {
      if ((b0 + sh.nsub) * sh.BS <= sh.first_key) continue;  // outside every row's window: all weights 0
      score_span(c, it, sh, b0, end, w, sp);
      softmax_span(*c.vec, sh, b0 * sh.BS, sp, w);
      accumulate_span(c, sh, sp, w);
    }
    end_part(sh, it, p, w);
  }
  if (!it.partial) store_item(c, sh, w);
}

// An item split into pieces: its rows' part states are at `partial` ([nparts][rows][D + 2], in part order),
// written by the pieces in the parallel section.
struct Split {
  WorkItem item;  // the item as planned (all its parts and kv heads)
  int64_t nparts, rows;
  float* partial;
};

// A call's plan, kept per calling thread and reused (no heap allocation once it has grown).
struct Plan {
  std::vector<int32_t> token_seq;  // [T] the sequence of each token
  std::vector<WorkItem> items;
  std::vector<Split> splits;
  std::vector<float> q_work;    // [T, H*D] roped (and rotated) queries
  std::vector<int8_t> q_codes;  // [T, H*D] their int8 codes (int8 / int4 caches)
  std::vector<float> q_mul;     // [T, H]
  std::vector<float> partials;  // split items' part states
  int64_t work = 0;             // query rows x keys over all items
};

// token_seq <- the sequence of each token; one item per (sequence, tile of kTileTokens, kv heads): as many
// kv heads as keep the item within kItemRows query rows, at least one (decode and verify tiles: all of
// them; a 16-token prefill tile of SmolLM2, 48 rows per kv head: one each, as its K/V blocks are reused by
// many rows anyway and more rows only spill its scratch out of L1: prefill 512 measured 5% slower).
void plan_items(const PagedAttentionDims& d, const PagedAttentionArgs& a, Plan& plan) {
  plan.token_seq.resize(static_cast<size_t>(d.num_tokens));
  plan.items.clear();
  plan.work = 0;
  const int64_t G = d.num_heads / d.kv_heads;
  for (int64_t s = 0; s < d.num_seqs; ++s) {
    const int32_t len = a.cu_seqlens[s + 1] - a.cu_seqlens[s];
    for (int32_t j = 0; j < len; ++j) plan.token_seq[a.cu_seqlens[s] + j] = static_cast<int32_t>(s);
    for (int32_t t0 = 0; t0 < len; t0 += static_cast<int32_t>(kTileTokens)) {
      const int32_t t1 = std::min<int32_t>(len, t0 + static_cast<int32_t>(kTileTokens));
      const int64_t heads = std::clamp<int64_t>(kItemRows / ((t1 - t0) * G), 1, d.kv_heads);
      for (int64_t g = 0; g < d.kv_heads; g += heads) {
        const int32_t g1 = static_cast<int32_t>(std::min(d.kv_heads, g + heads));
        const int64_t cost = (t1 - t0) * (g1 - g) * G * (a.context_lens[s] + t1);
        plan.items.push_back({static_cast<int32_t>(s), t0, t1, static_cast<int32_t>(g), g1, cost});
        plan.work += cost;
      }
    }
  }
}

// With fewer than kMinItems items, each is cut into pieces along its parts (whole parts, so each piece still
// reads whole blocks of all its kv heads, linearly when the blocks are consecutive), or, for an item of one
// part only, along its kv heads.
// The pieces replace the item, each pointing at its rows' slots in `partials`. The bits do not depend on
// this: a row's parts and their merge are the same either way.
void split_items(const PagedAttentionDims& d, const PagedAttentionArgs& a, Plan& plan) {
  std::vector<WorkItem>& items = plan.items;
  if (items.empty() || items.size() >= kMinItems) return;
  const int64_t G = d.num_heads / d.kv_heads, D = d.head_size, BS = d.block_size, PB = part_blocks(BS);
  const size_t base = items.size();
  const int64_t want = static_cast<int64_t>((kMinItems + base - 1) / base);  // pieces per item
  auto parts_of = [&](const WorkItem& w) { return ((a.context_lens[w.seq] + w.t1 + BS - 1) / BS + PB - 1) / PB; };
  auto rows_of = [&](const WorkItem& w) { return static_cast<int64_t>(w.t1 - w.t0) * (w.g1 - w.g0) * G; };
  size_t total = 0;  // floats of every split item's part states
  for (size_t i = 0; i < base; ++i) total += static_cast<size_t>(parts_of(items[i]) * rows_of(items[i]) * (D + 2));
  plan.partials.resize(total);
  float* next = plan.partials.data();
  for (size_t i = 0; i < base; ++i) {
    const WorkItem w = items[i];
    const int64_t nparts = parts_of(w), ntok = w.t1 - w.t0, kv_len = a.context_lens[w.seq] + w.t1;
    const int64_t by_parts = std::min(want, nparts);
    const int64_t nh = w.g1 - w.g0;
    const int64_t by_heads = by_parts >= 2 ? 1 : std::min<int64_t>(nh, want);
    if (by_parts * by_heads < 2) continue;
    const int64_t per_part = (nparts + by_parts - 1) / by_parts, per_head = (nh + by_heads - 1) / by_heads;
    const int64_t rows = rows_of(w);
    for (int64_t p = 0; p < nparts; p += per_part) {
      for (int64_t g = w.g0; g < w.g1; g += per_head) {
        WorkItem piece = w;
        piece.part0 = p;
        piece.part1 = std::min(nparts, p + per_part);
        piece.g0 = static_cast<int32_t>(g);
        piece.g1 = static_cast<int32_t>(std::min<int64_t>(w.g1, g + per_head));
        piece.cost = ntok * (piece.g1 - piece.g0) * G * (std::min(kv_len, piece.part1 * PB * BS) - p * PB * BS);
        piece.partial = next;
        piece.split_rows = rows;
        piece.row0 = (g - w.g0) * ntok * G;
        items.push_back(piece);
      }
    }
    plan.splits.push_back({w, nparts, rows, next});
    next += nparts * rows * (D + 2);
    items[i].cost = -1;  // replaced by its pieces
  }
  items.erase(std::remove_if(items.begin(), items.end(), [](const WorkItem& w) { return w.cost < 0; }), items.end());
}

// Merges the parts of split items, in part order, with the same merge_part as inside an item; out <- A / L.
void merge_splits(const VecOps& v, const PagedAttentionDims& d, const PagedAttentionArgs& a,
                  const std::vector<Split>& splits) {
  const int64_t D = d.head_size;
  for (const Split& sp : splits) {
    const ItemShape sh = item_shape(d, a, sp.item);
    WorkItem at = sp.item;  // addresses the states: row0 = 0, all rows
    at.partial = sp.partial;
    at.split_rows = sp.rows;
    at.row0 = 0;
    for (int64_t r = 0; r < sh.rows; ++r) {
      float* dst = a.out + row_offset(sh, r);
      float M = -std::numeric_limits<float>::infinity(), L = 0.f;
      std::fill(dst, dst + D, 0.f);  // the running A, normalized in place at the end
      for (int64_t p = 0; p < sp.nparts; ++p) {
        const float* st = part_state(at, D, p, r);
        merge_part(D, st, st[D], st[D + 1], dst, M, L);
      }
      if (a.sinks) add_sink(D, a.sinks[row_head(sh, r)], dst, M, L);
      finish_row(v, D, dst, L, dst, sh.unrotate);
    }
  }
}

}  // namespace

void paged_attention(const PagedAttentionDims& d, const PagedAttentionArgs& a, const Parallel& par, const OpsIsa& isa) {
  const int64_t T = d.num_tokens;
  if (T == 0) return;
  thread_local Plan plan;
  plan_items(d, a, plan);
  // Small calls run on the calling thread: waking the pool costs more than it saves (see kSerialWork).
  const bool parallel = par.for_each != nullptr && plan.work >= kSerialWork;
  const Parallel serial{};
  const Parallel& pool = parallel ? par : serial;
  plan.splits.clear();
  if (parallel) split_items(d, a, plan);
  // longest first (ties in plan order; std::sort, unlike stable_sort, allocates nothing)
  std::sort(plan.items.begin(), plan.items.end(), [](const WorkItem& x, const WorkItem& y) {
    if (x.cost != y.cost) return x.cost > y.cost;
    return std::tie(x.seq, x.t0, x.g0, x.part0) < std::tie(y.seq, y.t0, y.g0, y.part0);
  });
  plan.q_work.resize(static_cast<size_t>(T * d.num_heads * d.head_size));
  plan.q_codes.resize(int_dots(d.kv_dtype) ? plan.q_work.size() : 0);
  plan.q_mul.resize(int_dots(d.kv_dtype) ? static_cast<size_t>(T * d.num_heads) : 0);
  Ctx c{
      &d,     &a, plan.token_seq.data(), plan.q_work.data(), plan.q_codes.data(), plan.q_mul.data(), plan.items.data(),
      isa.vec};
  // Two or more tokens write their rows on the pool (kParallelTokens); one token writes on the calling thread.
  (T >= kParallelTokens ? pool : serial).run(static_cast<size_t>(T), write_token, &c);
  pool.run(plan.items.size(), attend_item, &c);
  merge_splits(*isa.vec, d, a, plan.splits);
}

}  // namespace ortllm
