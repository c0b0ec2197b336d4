// ORT-facing wrapper of PagedAttention: attributes, shape and index validation (each error names
// the input and the bad value; nothing is written before validation passes, so a bad call never
// touches memory out of bounds), cache aliasing (copy input -> output only when ORT gave a
// different buffer), then the pure kernel on the session's intra-op pool.
#include "paged_attention_op.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "../kernels/paged_attention.h"

namespace ortllm {

namespace {
constexpr const char* kOp = "PagedAttention";

template <typename T>
void alias_or_copy(const T* in, T* out, int64_t n) {
  if (out != in && n > 0) std::memcpy(out, in, sizeof(T) * static_cast<size_t>(n));
}

using F32 = Ort::Custom::Tensor<float>;
using I32 = Ort::Custom::Tensor<int32_t>;
using F16 = Ort::Custom::Tensor<Ort::Float16_t>;

// What the attributes fix and what the inputs' shapes give.
struct Extents {
  int64_t H, Hkv, D, BS;  // attributes
  bool eight_bit;
  int64_t T = 0, S = 0, MB = 0, max_pos = 0, NB = 0;  // tokens, sequences, block-table columns, rope rows, blocks
  bool have_scales = false, have_scale_outs = false;
};

// Every input's shape against the attributes; fills the extents.
template <typename CacheT>
void check_shapes(Extents& e, const F32& q, const F32& k, const F32& v, const I32& positions, const I32& cu_seqlens,
                  const I32& context_lens, const I32& block_tables, const F32& cos_cache, const F32& sin_cache,
                  const Ort::Custom::Tensor<CacheT>& key_cache, const Ort::Custom::Tensor<CacheT>& value_cache,
                  std::optional<const F16*> key_scales, std::optional<const F16*> value_scales,
                  std::optional<F16*> key_scales_out, std::optional<F16*> value_scales_out) {
  const int64_t H = e.H, Hkv = e.Hkv, D = e.D, BS = e.BS;
  const auto& qs = q.Shape();
  if (qs.size() != 2) fail(kOp, ": input 'q' must be [T, num_heads*head_size]; got shape ", shape_str(qs));
  const int64_t T = qs[0];
  expect_shape(kOp, "q", qs, {T, H * D});
  expect_shape(kOp, "k", k.Shape(), {T, Hkv * D});
  expect_shape(kOp, "v", v.Shape(), {T, Hkv * D});
  expect_shape(kOp, "positions", positions.Shape(), {T});
  const auto& cs = cu_seqlens.Shape();
  if (cs.size() != 1 || cs[0] < 1)
    fail(kOp, ": input 'cu_seqlens' must be [S+1] with S >= 0; got shape ", shape_str(cs));
  const int64_t S = cs[0] - 1;
  expect_shape(kOp, "context_lens", context_lens.Shape(), {S});
  const auto& bts = block_tables.Shape();
  expect_shape(kOp, "block_tables", bts, {S, -1});
  const auto& cos_s = cos_cache.Shape();
  expect_shape(kOp, "cos_cache", cos_s, {-1, D / 2});
  const int64_t max_pos = cos_s[0];
  expect_shape(kOp, "sin_cache", sin_cache.Shape(), {max_pos, D / 2});
  const auto& kcs = key_cache.Shape();
  if (kcs.size() != 4)
    fail(kOp, ": input 'key_cache' must be [num_blocks, kv_num_heads, block_size, head_size]; got shape ",
         shape_str(kcs));
  const int64_t NB = kcs[0];
  expect_shape(kOp, "key_cache", kcs, {NB, Hkv, BS, D});
  expect_shape(kOp, "value_cache", value_cache.Shape(), {NB, Hkv, BS, D});
  e.have_scales =
      key_scales.has_value() && value_scales.has_value() && *key_scales != nullptr && *value_scales != nullptr;
  e.have_scale_outs = key_scales_out.has_value() && value_scales_out.has_value() && *key_scales_out != nullptr &&
                      *value_scales_out != nullptr;
  if (e.eight_bit) {
    if (!e.have_scales)
      fail(kOp,
           ": inputs 'key_scales' and 'value_scales' [num_blocks, kv_num_heads, block_size] "
           "are required for kv_dtype int8/fp8_e4m3");
    if (!e.have_scale_outs)
      fail(kOp,
           ": outputs 'key_scales_out' and 'value_scales_out' are required for kv_dtype "
           "int8/fp8_e4m3");
    expect_shape(kOp, "key_scales", (*key_scales)->Shape(), {NB, Hkv, BS});
    expect_shape(kOp, "value_scales", (*value_scales)->Shape(), {NB, Hkv, BS});
  }
  e.T = T;
  e.S = S;
  e.MB = bts[1];
  e.max_pos = max_pos;
  e.NB = NB;
}

// Every index the kernel will follow (cu_seqlens, positions, context_lens, block_tables), before anything
// is written.
void check_values(const Extents& e, const int32_t* cu, const int32_t* pos, const int32_t* ctxl, const int32_t* bt) {
  const int64_t T = e.T, S = e.S, MB = e.MB, NB = e.NB, BS = e.BS, max_pos = e.max_pos;
  if (cu[0] != 0) fail(kOp, ": input 'cu_seqlens'[0] = ", cu[0], " must be 0");
  for (int64_t s = 0; s < S; ++s)
    if (cu[s + 1] < cu[s])
      fail(kOp, ": input 'cu_seqlens'[", s + 1, "] = ", cu[s + 1], " is less than cu_seqlens[", s, "] = ", cu[s],
           " (must be non-decreasing)");
  if (cu[S] != T) fail(kOp, ": input 'cu_seqlens'[", S, "] = ", cu[S], " must equal the number of tokens T = ", T);
  for (int64_t t = 0; t < T; ++t)
    if (pos[t] < 0 || pos[t] >= max_pos)
      fail(kOp, ": input 'positions'[", t, "] = ", pos[t], " is outside the rope cache [0, ", max_pos,
           ") (cos_cache has ", max_pos, " rows)");
  for (int64_t s = 0; s < S; ++s) {
    if (ctxl[s] < 0) fail(kOp, ": input 'context_lens'[", s, "] = ", ctxl[s], " is negative");
    const int64_t len = cu[s + 1] - cu[s];
    if (len == 0) continue;
    const int64_t need = (static_cast<int64_t>(ctxl[s]) + len + BS - 1) / BS;
    if (need > MB)
      fail(kOp, ": sequence ", s, " needs ", need, " blocks (context_lens[", s, "] = ", ctxl[s], " + ", len,
           " new tokens, block_size ", BS, ") but 'block_tables' has ", MB, " columns");
    for (int64_t b = 0; b < need; ++b) {
      const int32_t id = bt[s * MB + b];
      if (id < 0 || id >= NB)
        fail(kOp, ": input 'block_tables'[", s, "][", b, "] = ", id, " is not a block id in [0, num_blocks = ", NB,
             ")");
    }
  }
}

// The outputs. Aliasing: the engine binds the cache OrtValues as both input and output, so a copy happens only
// when ORT gave a different buffer. Returns the scale outputs (null when there are none).
template <typename CacheT>
std::pair<Ort::Float16_t*, Ort::Float16_t*> allocate_outputs(
    const Extents& e, const Ort::Custom::Tensor<CacheT>& key_cache, const Ort::Custom::Tensor<CacheT>& value_cache,
    std::optional<const F16*> key_scales, std::optional<const F16*> value_scales,
    Ort::Custom::Tensor<CacheT>& key_cache_out, Ort::Custom::Tensor<CacheT>& value_cache_out,
    std::optional<F16*> key_scales_out, std::optional<F16*> value_scales_out, CacheT*& kc, CacheT*& vc) {
  const int64_t cache_elems = e.NB * e.Hkv * e.BS * e.D;
  const auto& kcs = key_cache.Shape();
  kc = key_cache_out.Allocate(kcs);
  vc = value_cache_out.Allocate(kcs);
  alias_or_copy(key_cache.Data(), kc, cache_elems);
  alias_or_copy(value_cache.Data(), vc, cache_elems);
  Ort::Float16_t* ks = nullptr;
  Ort::Float16_t* vs = nullptr;
  if (e.have_scale_outs) {
    // float32 caches: scales are unused; pass through whatever was given (or an empty tensor).
    const std::vector<int64_t> ss = e.have_scales ? (*key_scales)->Shape() : std::vector<int64_t>{0};
    const std::vector<int64_t> vss = e.have_scales ? (*value_scales)->Shape() : std::vector<int64_t>{0};
    ks = (*key_scales_out)->Allocate(ss);
    vs = (*value_scales_out)->Allocate(vss);
    if (e.have_scales) {
      alias_or_copy((*key_scales)->Data(), ks, (*key_scales)->NumberOfElement());
      alias_or_copy((*value_scales)->Data(), vs, (*value_scales)->NumberOfElement());
    }
  }
  return {ks, vs};
}
}  // namespace

template <typename CacheT>
PagedAttentionOp<CacheT>::PagedAttentionOp(const OrtApi* api, const OrtKernelInfo* info) {
  num_heads_ = attr_int(api, info, "num_heads", 0);
  kv_heads_ = attr_int(api, info, "kv_num_heads", 0);
  head_size_ = attr_int(api, info, "head_size", 0);
  block_size_ = attr_int(api, info, "block_size", 0);
  const std::string dt = attr_string(api, info, "kv_dtype", "float32");
  const int64_t interleaved = attr_int(api, info, "rope_interleaved", 0);
  interleaved_ = interleaved != 0;
  constexpr bool float_cache = std::is_same<CacheT, float>::value;
  std::ostringstream err;
  if (dt == "float32") {
    kv_dtype_ = KvDtype::kFloat32;
  } else if (dt == "int8") {
    kv_dtype_ = KvDtype::kInt8;
  } else if (dt == "fp8_e4m3") {
    kv_dtype_ = KvDtype::kFp8E4M3;
  } else {
    err << kOp << ": attribute kv_dtype = '" << dt << "' is not float32, int8 or fp8_e4m3";
  }
  const bool eight_bit = kv_dtype_ != KvDtype::kFloat32;
  rotate_ = attr_int(api, info, "rotate", eight_bit ? 1 : 0) != 0;
  if (err.tellp() == 0) {
    if (num_heads_ <= 0 || kv_heads_ <= 0 || num_heads_ % kv_heads_ != 0)
      err << kOp << ": attributes num_heads = " << num_heads_ << ", kv_num_heads = " << kv_heads_
          << " must be positive with num_heads % kv_num_heads == 0";
    else if (head_size_ <= 0 || head_size_ % 2 != 0)
      err << kOp << ": attribute head_size = " << head_size_ << " must be positive and even";
    else if (rotate_ && (head_size_ & (head_size_ - 1)) != 0)
      err << kOp << ": attribute head_size = " << head_size_
          << " must be a power of two when rotate = 1 (Hadamard transform)";
    else if (block_size_ <= 0)
      err << kOp << ": attribute block_size = " << block_size_ << " must be positive";
    else if (float_cache == eight_bit)
      err << kOp << ": attribute kv_dtype = '" << dt << "' needs " << (eight_bit ? "uint8" : "float32")
          << " key_cache/value_cache tensors";
    else if (interleaved != 0 && interleaved != 1)
      err << kOp << ": attribute rope_interleaved = " << interleaved << " must be 0 or 1";
  }
  init_error_ = err.str();
  scale_ = attr_float(api, info, "scale", 0.f);
  if (scale_ == 0.f && head_size_ > 0) scale_ = 1.f / std::sqrt(static_cast<float>(head_size_));
}

template <typename CacheT>
Ort::Status PagedAttentionOp<CacheT>::Compute(OrtKernelContext* ctx, const F32& q, const F32& k, const F32& v,
                                              const I32& positions, const I32& cu_seqlens, const I32& context_lens,
                                              const I32& block_tables, const F32& cos_cache, const F32& sin_cache,
                                              const Cache& key_cache, const Cache& value_cache,
                                              std::optional<const F16*> key_scales,
                                              std::optional<const F16*> value_scales, F32& attn, Cache& key_cache_out,
                                              Cache& value_cache_out, std::optional<F16*> key_scales_out,
                                              std::optional<F16*> value_scales_out) {
  try {
    if (!init_error_.empty()) throw OpError(init_error_);
    Extents e{num_heads_, kv_heads_, head_size_, block_size_, kv_dtype_ != KvDtype::kFloat32};
    check_shapes<CacheT>(e, q, k, v, positions, cu_seqlens, context_lens, block_tables, cos_cache, sin_cache, key_cache,
                         value_cache, key_scales, value_scales, key_scales_out, value_scales_out);
    check_values(e, cu_seqlens.Data(), positions.Data(), context_lens.Data(), block_tables.Data());

    float* out = attn.Allocate({e.T, e.H * e.D});
    CacheT* kc = nullptr;
    CacheT* vc = nullptr;
    const auto [ks, vs] = allocate_outputs<CacheT>(e, key_cache, value_cache, key_scales, value_scales, key_cache_out,
                                                   value_cache_out, key_scales_out, value_scales_out, kc, vc);
    if (e.T == 0) return Ort::Status{nullptr};

    PagedAttentionDims dims{e.T,  e.S,       e.H,       e.Hkv,   e.D,          e.BS,  e.MB,
                            e.NB, e.max_pos, kv_dtype_, rotate_, interleaved_, scale_};
    PagedAttentionArgs args{q.Data(),
                            k.Data(),
                            v.Data(),
                            positions.Data(),
                            cu_seqlens.Data(),
                            context_lens.Data(),
                            block_tables.Data(),
                            cos_cache.Data(),
                            sin_cache.Data(),
                            kc,
                            vc,
                            reinterpret_cast<uint16_t*>(ks),
                            reinterpret_cast<uint16_t*>(vs),
                            out};
    Parallel par{ort_parallel_for, ctx};
    paged_attention(dims, args, par);
    return Ort::Status{nullptr};
  } catch (const OpError& e) {
    return Ort::Status(e.what(), ORT_INVALID_ARGUMENT);
  } catch (const std::exception& e) {
    return Ort::Status((std::string(kOp) + ": " + e.what()).c_str(), ORT_RUNTIME_EXCEPTION);
  } catch (...) {
    return Ort::Status("PagedAttention: unknown error", ORT_RUNTIME_EXCEPTION);
  }
}

template struct PagedAttentionOp<float>;
template struct PagedAttentionOp<uint8_t>;

}  // namespace ortllm
