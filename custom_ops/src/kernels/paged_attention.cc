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
  int64_t blk0 = 0, blk1 = -1;   // key blocks [blk0, blk1) of this item (-1: all it needs)
  float* partial = nullptr;      // split items: [rows, D] unnormalized O | m [rows] | l [rows]
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
      a.key_scales[slot] = d.kv_dtype == KvDtype::kInt8 ? quantize_int8(row.data(), D, dst)
                                                        : quantize_e4m3(row.data(), D, dst);
    }
    // value (no rope, no rotation)
    const float* vsrc = a.v + t * Hkv * D + g * D;
    if (!eight_bit) {
      std::memcpy(static_cast<float*>(a.value_cache) + slot * D, vsrc, sizeof(float) * D);
    } else {
      uint8_t* dst = static_cast<uint8_t*>(a.value_cache) + slot * D;
      a.value_scales[slot] = d.kv_dtype == KvDtype::kInt8 ? quantize_int8(vsrc, D, dst)
                                                          : quantize_e4m3(vsrc, D, dst);
    }
  }
}

// Phase 2: one (sequence, kv head, query tile) item; see the file header.
void attend_item(void* usr, size_t ii) {
  const Ctx& c = *static_cast<const Ctx*>(usr);
  const PagedAttentionDims& d = *c.d;
  const PagedAttentionArgs& a = *c.a;
  const VecOps& vec = *c.vec;
  const WorkItem& it = c.items[ii];
  const int64_t D = d.head_size, H = d.num_heads, Hkv = d.kv_heads, BS = d.block_size;
  const int64_t G = H / Hkv;
  const int64_t ntok = it.t1 - it.t0;
  const int64_t rows = ntok * G;
  const int64_t tok0 = a.cu_seqlens[it.seq] + it.t0;         // first global token of the tile
  const int64_t pos0 = a.context_lens[it.seq] + it.t0;       // its cache position
  const int64_t kv_len = a.context_lens[it.seq] + it.t1;     // keys needed by the last row
  const bool eight_bit = d.kv_dtype != KvDtype::kFloat32;

  // Keys are processed kSpan at a time (several cache blocks), so the per-row softmax bookkeeping
  // (max, rescale of O) is amortized over kSpan keys, not block_size.
  const int64_t nsub = std::max<int64_t>(1, kSpanKeys / BS);
  const int64_t span = nsub * BS;
  // scratch: Qb [rows, D] | O [rows, D] | S [rows, span] | m [rows] | l [rows] | Kb, Vb [span, D]
  // (uninitialized: only O and l need zeros; S, Kb, Vb are written before they are read)
  std::unique_ptr<float[]> buf(
      new float[static_cast<size_t>(rows * (2 * D + span + 2) + (eight_bit ? 2 * span * D : 0))]);
  float* Qb = buf.get();
  float* O = Qb + rows * D;
  float* S = O + rows * D;
  float* m = S + rows * span;
  float* l = m + rows;
  float* Kb = l + rows;
  float* Vb = Kb + span * D;
  for (int64_t tt = 0; tt < ntok; ++tt)  // row r = tt * G + hh  <-  query head g * G + hh
    std::memcpy(Qb + tt * G * D, c.q_work + (tok0 + tt) * H * D + it.kv_head * G * D,
                sizeof(float) * G * D);
  std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
  std::fill(l, l + rows, 0.f);
  std::fill(O, O + rows * D, 0.f);
  auto deq = d.kv_dtype == KvDtype::kInt8 ? vec.dequant_i8 : vec.dequant_e4m3;
  const int Di = static_cast<int>(D);

  const int64_t nblocks = it.blk1 >= 0 ? it.blk1 : (kv_len + BS - 1) / BS;
  const float* Ks[64];
  const float* Vs[64];
  int nks[64];
  for (int64_t b0 = it.blk0; b0 < nblocks; b0 += nsub) {
    const int64_t kstart = b0 * BS;
    const int64_t nb = std::min(nsub, nblocks - b0);
    int nk = 0;  // keys in this span
    for (int64_t sb = 0; sb < nb; ++sb) {
      const int64_t block = a.block_tables[it.seq * d.max_blocks + b0 + sb];
      const int64_t base = (block * Hkv + it.kv_head) * BS;  // first row of this block/head
      nks[sb] = static_cast<int>(std::min(BS, kv_len - (b0 + sb) * BS));
      if (!eight_bit) {
        Ks[sb] = static_cast<const float*>(a.key_cache) + base * D;
        Vs[sb] = static_cast<const float*>(a.value_cache) + base * D;
      } else {
        float* kb = Kb + sb * BS * D;
        float* vb = Vb + sb * BS * D;
        deq(static_cast<const uint8_t*>(a.key_cache) + base * D, a.key_scales + base, nks[sb], Di, kb);
        deq(static_cast<const uint8_t*>(a.value_cache) + base * D, a.value_scales + base, nks[sb], Di, vb);
        Ks[sb] = kb;
        Vs[sb] = vb;
      }
      vec.scores(Qb, static_cast<int>(rows), Ks[sb], nks[sb], Di, d.scale, S + sb * BS,
                 static_cast<int>(span));
      nk += nks[sb];
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = S + r * span;
      const int64_t qpos = pos0 + r / G;
      const int nvalid = static_cast<int>(std::min<int64_t>(nk, qpos - kstart + 1));
      if (nvalid <= 0) {
        std::fill(sr, sr + nk, 0.f);
        continue;
      }
      const float m_new = std::max(m[r], vec.max(sr, nvalid));
      const float corr = std::exp(m[r] - m_new);  // 0 on the first span (m = -inf)
      const float sum = vec.exp_sum(sr, nvalid, m_new);
      std::fill(sr + nvalid, sr + nk, 0.f);
      if (corr != 1.f) vec.scal(O + r * D, Di, corr);
      l[r] = l[r] * corr + sum;
      m[r] = m_new;
    }
    for (int64_t sb = 0; sb < nb; ++sb)
      vec.pv(S + sb * BS, static_cast<int>(span), static_cast<int>(rows), Vs[sb], nks[sb], Di, O);
  }

  if (it.partial) {  // one part of a split decode item: keep the unnormalized state for the merge
    std::memcpy(it.partial, O, sizeof(float) * rows * D);
    std::memcpy(it.partial + rows * D, m, sizeof(float) * rows);
    std::memcpy(it.partial + rows * D + rows, l, sizeof(float) * rows);
    return;
  }
  for (int64_t tt = 0; tt < ntok; ++tt) {
    for (int64_t hh = 0; hh < G; ++hh) {
      const int64_t r = tt * G + hh;
      const float inv = 1.f / l[r];  // l >= 1: the row's own key is always valid
      float* dst = a.out + (tok0 + tt) * H * D + (it.kv_head * G + hh) * D;
      for (int64_t x = 0; x < D; ++x) dst[x] = O[r * D + x] * inv;
    }
  }
}

}  // namespace

void paged_attention(const PagedAttentionDims& d, const PagedAttentionArgs& a,
                     const Parallel& par) {
  const int64_t T = d.num_tokens;
  if (T == 0) return;
  std::vector<int32_t> token_seq(static_cast<size_t>(T));
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
  // Split long decode items when there are too few items for the pool (see kMinItems).
  const int64_t G = d.num_heads / d.kv_heads, D = d.head_size, BS = d.block_size;
  const int64_t nsub = std::max<int64_t>(1, kSpanKeys / BS);
  const size_t part_floats = static_cast<size_t>(G * D + 2 * G);
  std::vector<float> partials;
  struct Split {
    size_t first, count;  // parts items[first, first + count)
    int32_t seq, kv_head;
  };
  std::vector<Split> splits;
  if (items.size() < kMinItems) {
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
      items.erase(std::remove_if(items.begin(), items.end(), [](const WorkItem& w) { return w.cost < 0; }),
                  items.end());
      const size_t offset = items.size();
      for (Split& sp : splits) sp.first += offset;
      items.insert(items.end(), parts.begin(), parts.end());
    }
  }
  std::vector<WorkItem> order = items;  // run longest first; `items` keeps the split layout
  std::stable_sort(order.begin(), order.end(),
                   [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });
  std::vector<float> q_work(static_cast<size_t>(T * d.num_heads * d.head_size));
  Ctx c{&d, &a, token_seq.data(), q_work.data(), order.data(), &vec()};
  par.run(static_cast<size_t>(T), write_token, &c);
  par.run(order.size(), attend_item, &c);

  // Merge the parts of split items: m = max m_p, l = sum l_p e^(m_p - m), O = sum O_p e^(m_p - m).
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

}  // namespace ortllm
