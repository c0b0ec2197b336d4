// PagedAttention kernel (pure; see paged_attention.h for the argument shapes).
//
// What it computes, per call with T new tokens from S sequences:
//   1. for every new token t of sequence s (slot p = context_lens[s] + t - cu_seqlens[s]):
//        q_t, k_t <- RoPE at positions[t];  8-bit + rotate: q_t, k_t <- H q_t / sqrt(D) per head
//        K/V rows of every kv head -> cache block block_tables[s][p / BS], offset p % BS
//        (fp32 copied; 8-bit quantized per (token, head) with one fp16 scale; V is never rotated)
//   2. for every new token t and query head h (kv head g = h / (H / Hkv)):
//        out[t, h] = softmax_j(scale * q_t,h . K[s, g, j]) @ V[s, g, :],  j = 0 .. p(t)  (causal)
//      read back from the cache (so new tokens see exactly what later steps will see).
// Why this way:
//   - Work item = (sequence, kv head, tile of up to kTileTokens query tokens). All G = H/Hkv query
//     heads sharing a kv head and all tokens of the tile form the rows of one item, so every K/V
//     block is loaded (and for 8-bit dequantized into a small scratch, on the fly) once per item and
//     used by rows = tile * G queries: decode tokens get G rows, prefill tiles up to 16 * G (blocked
//     prefill: [rows, D] x [D, span] score tiles). Items run on the session pool, longest first.
//   - Online softmax over spans of kSpanKeys keys (several cache blocks; running max m, sum l,
//     rescaled accumulator O) in fp32, so no [T, context] score matrix is ever materialized, decode
//     at context 2048 streams the cache once, and the per-row bookkeeping is amortized over 64 keys.
//   - Keys inside a span are in position order, so the causal mask of a row is a prefix length.
#include "paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "vec.h"

namespace ortllm {
namespace {

constexpr int64_t kTileTokens = 16;
constexpr int64_t kSpanKeys = 64;  // keys per online-softmax step (<= 64 blocks of size >= 1)

// Decode items over long contexts are split along the keys ("flash-decoding") when there are too
// few items to keep the pool busy (B = 1: only Hkv items); the parts are merged afterwards.
constexpr size_t kMinItems = 8;
constexpr int64_t kSplitKeys = 512;  // at least this many keys per part

struct WorkItem {
  int32_t seq, kv_head, t0, t1;  // query tokens [t0, t1) of the sequence (relative to cu_seqlens[seq])
  int64_t cost;
  int64_t blk0 = 0, blk1 = -1;  // key blocks [blk0, blk1) of this item (-1: all it needs)
  float* partial = nullptr;     // split items: [rows, D] unnormalized O | m [rows] | l [rows]
};

struct Ctx {
  const PagedAttentionDims* d;
  const PagedAttentionArgs* a;
  const int32_t* token_seq;  // [T]
  float* q_work;             // [T, H*D] roped (and rotated) queries
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
  const bool eight_bit = d.kv_dtype != KvDtype::kFloat32;

  for (int64_t h = 0; h < H; ++h) {
    float* qr = c.q_work + t * H * D + h * D;
    std::memcpy(qr, a.q + t * H * D + h * D, sizeof(float) * D);
    apply_rope(qr, static_cast<int>(D), cs, sn, d.rope_interleaved);
    if (d.rotate) fwht_normalized(qr, static_cast<int>(D));
  }

  const int64_t block = a.block_tables[s * d.max_blocks + p / BS];
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t g = 0; g < Hkv; ++g) {
    const int64_t slot = (block * Hkv + g) * BS + p % BS;  // row index into [NB*Hkv*BS]
    // key
    std::memcpy(row.data(), a.k + t * Hkv * D + g * D, sizeof(float) * D);
    apply_rope(row.data(), static_cast<int>(D), cs, sn, d.rope_interleaved);
    if (d.rotate) fwht_normalized(row.data(), static_cast<int>(D));
    if (!eight_bit) {
      std::memcpy(static_cast<float*>(a.key_cache) + slot * D, row.data(), sizeof(float) * D);
    } else {
      uint8_t* dst = static_cast<uint8_t*>(a.key_cache) + slot * D;
      a.key_scales[slot] =
          d.kv_dtype == KvDtype::kInt8 ? quantize_int8(row.data(), D, dst) : quantize_e4m3(row.data(), D, dst);
    }
    // value (no rope, no rotation)
    const float* vsrc = a.v + t * Hkv * D + g * D;
    if (!eight_bit) {
      std::memcpy(static_cast<float*>(a.value_cache) + slot * D, vsrc, sizeof(float) * D);
    } else {
      uint8_t* dst = static_cast<uint8_t*>(a.value_cache) + slot * D;
      a.value_scales[slot] = d.kv_dtype == KvDtype::kInt8 ? quantize_int8(vsrc, D, dst) : quantize_e4m3(vsrc, D, dst);
    }
  }
}

// Phase 2: one (sequence, kv head, query tile) item; see the file header. Its rows: r = tt * G + hh
// (token tt of the tile, query head kv_head * G + hh).
struct ItemShape {
  int64_t D, H, Hkv, BS, G;
  int64_t ntok, rows;
  int64_t tok0;    // first global token of the tile
  int64_t pos0;    // its cache position
  int64_t kv_len;  // keys needed by the last row
  int64_t nsub;    // cache blocks per span of keys
  int64_t span;    // keys per span (nsub * BS)
  bool eight_bit;
};

ItemShape item_shape(const PagedAttentionDims& d, const PagedAttentionArgs& a, const WorkItem& it) {
  ItemShape sh;
  sh.D = d.head_size;
  sh.H = d.num_heads;
  sh.Hkv = d.kv_heads;
  sh.BS = d.block_size;
  sh.G = sh.H / sh.Hkv;
  sh.ntok = it.t1 - it.t0;
  sh.rows = sh.ntok * sh.G;
  sh.tok0 = a.cu_seqlens[it.seq] + it.t0;
  sh.pos0 = a.context_lens[it.seq] + it.t0;
  sh.kv_len = a.context_lens[it.seq] + it.t1;
  // Keys are processed kSpan at a time (several cache blocks), so the per-row softmax bookkeeping
  // (max, rescale of O) is amortized over kSpan keys, not block_size.
  sh.nsub = std::max<int64_t>(1, kSpanKeys / sh.BS);
  sh.span = sh.nsub * sh.BS;
  sh.eight_bit = d.kv_dtype != KvDtype::kFloat32;
  return sh;
}

// scratch: Qb [rows, D] | O [rows, D] | S [rows, span] | m [rows] | l [rows] | Kb, Vb [span, D]
// (uninitialized: only O and l need zeros; S, Kb, Vb are written before they are read)
struct ItemScratch {
  std::unique_ptr<float[]> buf;
  float *Qb, *O, *S, *m, *l, *Kb, *Vb;

  explicit ItemScratch(const ItemShape& sh)
      : buf(new float[static_cast<size_t>(sh.rows * (2 * sh.D + sh.span + 2) +
                                          (sh.eight_bit ? 2 * sh.span * sh.D : 0))]) {
    Qb = buf.get();
    O = Qb + sh.rows * sh.D;
    S = O + sh.rows * sh.D;
    m = S + sh.rows * sh.span;
    l = m + sh.rows;
    Kb = l + sh.rows;
    Vb = Kb + sh.span * sh.D;
  }
};

// Qb <- the tile's roped queries of the item's G heads; m = -inf, l = 0, O = 0.
void load_queries(const Ctx& c, const WorkItem& it, const ItemShape& sh, ItemScratch& w) {
  for (int64_t tt = 0; tt < sh.ntok; ++tt)  // row r = tt * G + hh  <-  query head g * G + hh
    std::memcpy(w.Qb + tt * sh.G * sh.D, c.q_work + (sh.tok0 + tt) * sh.H * sh.D + it.kv_head * sh.G * sh.D,
                sizeof(float) * sh.G * sh.D);
  std::fill(w.m, w.m + sh.rows, -std::numeric_limits<float>::infinity());
  std::fill(w.l, w.l + sh.rows, 0.f);
  std::fill(w.O, w.O + sh.rows * sh.D, 0.f);
}

// The K/V rows of one span: nb cache blocks from key block b0 (dequantized into Kb/Vb for 8-bit caches).
struct Span {
  const float* Ks[64];
  const float* Vs[64];
  int nks[64];  // keys in each block
  int64_t nb;   // blocks in the span
  int nk;       // keys in the span
};

// Loads the span's blocks and writes their scores S [rows, span] = scale * Qb . K.
void score_span(const Ctx& c, const WorkItem& it, const ItemShape& sh, int64_t b0, int64_t nblocks, ItemScratch& w,
                Span& sp) {
  const PagedAttentionDims& d = *c.d;
  const PagedAttentionArgs& a = *c.a;
  const VecOps& vec = *c.vec;
  auto deq = d.kv_dtype == KvDtype::kInt8 ? vec.dequant_i8 : vec.dequant_e4m3;
  const int64_t D = sh.D, BS = sh.BS;
  const int Di = static_cast<int>(D);
  sp.nb = std::min(sh.nsub, nblocks - b0);
  sp.nk = 0;
  for (int64_t sb = 0; sb < sp.nb; ++sb) {
    const int64_t block = a.block_tables[it.seq * d.max_blocks + b0 + sb];
    const int64_t base = (block * sh.Hkv + it.kv_head) * BS;  // first row of this block/head
    sp.nks[sb] = static_cast<int>(std::min(BS, sh.kv_len - (b0 + sb) * BS));
    if (!sh.eight_bit) {
      sp.Ks[sb] = static_cast<const float*>(a.key_cache) + base * D;
      sp.Vs[sb] = static_cast<const float*>(a.value_cache) + base * D;
    } else {
      float* kb = w.Kb + sb * BS * D;
      float* vb = w.Vb + sb * BS * D;
      deq(static_cast<const uint8_t*>(a.key_cache) + base * D, a.key_scales + base, sp.nks[sb], Di, kb);
      deq(static_cast<const uint8_t*>(a.value_cache) + base * D, a.value_scales + base, sp.nks[sb], Di, vb);
      sp.Ks[sb] = kb;
      sp.Vs[sb] = vb;
    }
    vec.scores(w.Qb, static_cast<int>(sh.rows), sp.Ks[sb], sp.nks[sb], Di, d.scale, w.S + sb * BS,
               static_cast<int>(sh.span));
    sp.nk += sp.nks[sb];
  }
}

// Online softmax over the span's scores (causal: row r sees keys up to its own position): the scores
// become e^(s - m_new), O is rescaled by e^(m_old - m_new), l and m updated.
void softmax_span(const VecOps& vec, const ItemShape& sh, int64_t kstart, const Span& sp, ItemScratch& w) {
  const int Di = static_cast<int>(sh.D);
  for (int64_t r = 0; r < sh.rows; ++r) {
    float* sr = w.S + r * sh.span;
    const int64_t qpos = sh.pos0 + r / sh.G;
    const int nvalid = static_cast<int>(std::min<int64_t>(sp.nk, qpos - kstart + 1));
    if (nvalid <= 0) {
      std::fill(sr, sr + sp.nk, 0.f);
      continue;
    }
    const float m_new = std::max(w.m[r], vec.max(sr, nvalid));
    const float corr = std::exp(w.m[r] - m_new);  // 0 on the first span (m = -inf)
    const float sum = vec.exp_sum(sr, nvalid, m_new);
    std::fill(sr + nvalid, sr + sp.nk, 0.f);
    if (corr != 1.f) vec.scal(w.O + r * sh.D, Di, corr);
    w.l[r] = w.l[r] * corr + sum;
    w.m[r] = m_new;
  }
}

// O += P V over the span's blocks.
void accumulate_span(const VecOps& vec, const ItemShape& sh, const Span& sp, ItemScratch& w) {
  for (int64_t sb = 0; sb < sp.nb; ++sb)
    vec.pv(w.S + sb * sh.BS, static_cast<int>(sh.span), static_cast<int>(sh.rows), sp.Vs[sb], sp.nks[sb],
           static_cast<int>(sh.D), w.O);
}

// out <- O / l, or, for one part of a split decode item, the unnormalized state kept for the merge.
void store_item(const Ctx& c, const WorkItem& it, const ItemShape& sh, const ItemScratch& w) {
  const int64_t rows = sh.rows, D = sh.D;
  if (it.partial) {
    std::memcpy(it.partial, w.O, sizeof(float) * rows * D);
    std::memcpy(it.partial + rows * D, w.m, sizeof(float) * rows);
    std::memcpy(it.partial + rows * D + rows, w.l, sizeof(float) * rows);
    return;
  }
  for (int64_t tt = 0; tt < sh.ntok; ++tt) {
    for (int64_t hh = 0; hh < sh.G; ++hh) {
      const int64_t r = tt * sh.G + hh;
      const float inv = 1.f / w.l[r];  // l >= 1: the row's own key is always valid
      float* dst = c.a->out + (sh.tok0 + tt) * sh.H * D + (it.kv_head * sh.G + hh) * D;
      for (int64_t x = 0; x < D; ++x) dst[x] = w.O[r * D + x] * inv;
    }
  }
}

void attend_item(void* usr, size_t ii) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  const WorkItem& it = c.items[ii];
  const ItemShape sh = item_shape(*c.d, *c.a, it);
  ItemScratch w(sh);
  load_queries(c, it, sh, w);
  const int64_t nblocks = it.blk1 >= 0 ? it.blk1 : (sh.kv_len + sh.BS - 1) / sh.BS;
  Span sp;
  for (int64_t b0 = it.blk0; b0 < nblocks; b0 += sh.nsub) {
    score_span(c, it, sh, b0, nblocks, w, sp);
    softmax_span(*c.vec, sh, b0 * sh.BS, sp, w);
    accumulate_span(*c.vec, sh, sp, w);
  }
  store_item(c, it, sh, w);
}

// A decode item split along its keys: its parts are items[first, first + count).
struct Split {
  size_t first, count;
  int32_t seq, kv_head;
};

// token_seq [T] <- the sequence of each token; one item per (sequence, kv head, tile of kTileTokens).
std::vector<WorkItem> plan_items(const PagedAttentionDims& d, const PagedAttentionArgs& a,
                                 std::vector<int32_t>& token_seq) {
  std::vector<WorkItem> items;
  for (int64_t s = 0; s < d.num_seqs; ++s) {
    const int32_t len = a.cu_seqlens[s + 1] - a.cu_seqlens[s];
    for (int32_t j = 0; j < len; ++j) token_seq[a.cu_seqlens[s] + j] = static_cast<int32_t>(s);
    for (int32_t t0 = 0; t0 < len; t0 += static_cast<int32_t>(kTileTokens)) {
      const int32_t t1 = std::min<int32_t>(len, t0 + static_cast<int32_t>(kTileTokens));
      const int64_t cost = (t1 - t0) * (a.context_lens[s] + t1);
      for (int64_t g = 0; g < d.kv_heads; ++g)
        items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(g), t0, t1, cost});
    }
  }
  return items;
}

// Splits long decode items into parts of whole spans when there are too few items for the pool (see
// kMinItems); the parts go to the end of `items`, each with its slice of `partials`.
std::vector<Split> split_long_decodes(const PagedAttentionDims& d, const PagedAttentionArgs& a,
                                      std::vector<WorkItem>& items, std::vector<float>& partials) {
  std::vector<Split> splits;
  if (items.size() >= kMinItems) return splits;
  const int64_t G = d.num_heads / d.kv_heads, D = d.head_size, BS = d.block_size;
  const int64_t nsub = std::max<int64_t>(1, kSpanKeys / BS);
  const size_t part_floats = static_cast<size_t>(G * D + 2 * G);
  const size_t base = items.size();
  std::vector<WorkItem> parts;
  for (size_t i = 0; i < base; ++i) {
    const WorkItem& w = items[i];
    const int64_t kv_len = a.context_lens[w.seq] + w.t1;
    const int64_t want = static_cast<int64_t>((kMinItems + base - 1) / base);
    const int64_t n = std::min<int64_t>(want, kv_len / kSplitKeys);
    if (w.t1 - w.t0 != 1 || n < 2) continue;
    const int64_t nblocks = (kv_len + BS - 1) / BS;
    const int64_t per = ((nblocks + n - 1) / n + nsub - 1) / nsub * nsub;  // whole spans
    Split sp{base + parts.size(), 0, w.seq, w.kv_head};
    for (int64_t b = 0; b < nblocks; b += per) {
      WorkItem p = w;
      p.blk0 = b;
      p.blk1 = std::min(nblocks, b + per);
      p.cost = (p.blk1 - p.blk0) * BS;
      parts.push_back(p);
      ++sp.count;
    }
    items[i].cost = -1;  // replaced by its parts
    splits.push_back(sp);
  }
  if (!splits.empty()) {
    partials.resize(parts.size() * part_floats);
    for (size_t k = 0; k < parts.size(); ++k) parts[k].partial = partials.data() + k * part_floats;
    for (Split& sp : splits) sp.first -= base;  // index into `parts`
    items.erase(std::remove_if(items.begin(), items.end(), [](const WorkItem& w) { return w.cost < 0; }), items.end());
    const size_t offset = items.size();
    for (Split& sp : splits) sp.first += offset;
    items.insert(items.end(), parts.begin(), parts.end());
  }
  return splits;
}

// Merges the parts of split items: m = max m_p, l = sum l_p e^(m_p - m), O = sum O_p e^(m_p - m).
void merge_splits(const PagedAttentionDims& d, const PagedAttentionArgs& a, const std::vector<WorkItem>& items,
                  const std::vector<Split>& splits) {
  const int64_t G = d.num_heads / d.kv_heads, D = d.head_size;
  for (const Split& sp : splits) {
    const int64_t tok = a.cu_seqlens[sp.seq] + items[sp.first].t0;
    for (int64_t r = 0; r < G; ++r) {
      float mx = -std::numeric_limits<float>::infinity();
      for (size_t k = 0; k < sp.count; ++k) mx = std::max(mx, items[sp.first + k].partial[G * D + r]);
      float* dst = a.out + tok * d.num_heads * D + (sp.kv_head * G + r) * D;
      std::fill(dst, dst + D, 0.f);
      float lsum = 0.f;
      for (size_t k = 0; k < sp.count; ++k) {
        const float* part = items[sp.first + k].partial;
        const float w = std::exp(part[G * D + r] - mx);
        lsum += part[G * D + G + r] * w;
        for (int64_t x = 0; x < D; ++x) dst[x] += w * part[r * D + x];
      }
      const float inv = 1.f / lsum;
      for (int64_t x = 0; x < D; ++x) dst[x] *= inv;
    }
  }
}

}  // namespace

void paged_attention(const PagedAttentionDims& d, const PagedAttentionArgs& a, const Parallel& par) {
  const int64_t T = d.num_tokens;
  if (T == 0) return;
  std::vector<int32_t> token_seq(static_cast<size_t>(T));
  std::vector<WorkItem> items = plan_items(d, a, token_seq);
  std::vector<float> partials;
  const std::vector<Split> splits = split_long_decodes(d, a, items, partials);
  std::vector<WorkItem> order = items;  // run longest first; `items` keeps the split layout
  std::stable_sort(order.begin(), order.end(), [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });
  std::vector<float> q_work(static_cast<size_t>(T * d.num_heads * d.head_size));
  Ctx c{&d, &a, token_seq.data(), q_work.data(), order.data(), &vec()};
  par.run(static_cast<size_t>(T), write_token, &c);
  par.run(order.size(), attend_item, &c);
  merge_splits(d, a, items, splits);
}

}  // namespace ortllm
