// ORT-facing wrapper of PagedAttention: attributes, shape and index validation (each error names
// the input and the bad value; nothing is written before validation passes, so a bad call never
// touches memory out of bounds), cache aliasing (copy input -> output only when ORT gave a
// different buffer), then the pure kernel on the session's intra-op pool. No exception leaves ComputeV2.
// Inputs and outputs go through the C API directly: per input one type-and-shape query (none for the
// rope tables when they are initializers), no heap allocation in the wrapper unless a shape is wrong.
#include "paged_attention_op.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "../kernels/paged_attention.h"

namespace ortllm {

namespace {
constexpr const char* kOp = "PagedAttention";
enum Input {
  kQ,
  kK,
  kV,
  kPositions,
  kCuSeqlens,
  kContextLens,
  kBlockTables,
  kCos,
  kSin,
  kKeyCache,
  kValueCache,
  kKeyScales,
  kValueScales
};
enum Output { kAttn, kKeyCacheOut, kValueCacheOut, kKeyScalesOut, kValueScalesOut };

// With attribute layer = l: a cache input of every layer, [n_layers, ...], becomes layer l's slice (its data
// moved to the slice, its rank one less), so the rest of the wrapper sees one layer's cache. elem: bytes an element.
void take_layer(TensorIn& in, const char* name, int64_t layer, size_t elem) {
  if (in.value == nullptr) return;
  if (in.rank < 2 || in.rank > TensorIn::kMaxRank)
    fail(kOp, ": input '", name, "' must be [n_layers, ...] with attribute layer; got shape ", shape_str(in.shape()));
  const int64_t offset = layer_offset(kOp, "layer", name, in.dims, static_cast<size_t>(in.rank), layer);
  in.data = static_cast<const char*>(in.data) + static_cast<size_t>(offset) * elem;
  for (int i = 1; i < in.rank; ++i) in.dims[i - 1] = in.dims[i];
  --in.rank;
}

template <typename T>
void alias_or_copy(const void* in, T* out, int64_t n) {
  if (out != in && n > 0) std::memcpy(out, in, sizeof(T) * static_cast<size_t>(n));
}

// What the attributes fix and what the inputs' shapes give.
struct Extents {
  int64_t H, Hkv, D, BS;  // attributes
  bool quantized;         // int8, fp8 or int4: codes with fp16 scales
  int64_t row;            // the caches' last extent: D (fp32, fp16, 8-bit) or D / 2 (int4: two codes a byte)
  int64_t T = 0, S = 0, MB = 0, max_pos = 0, NB = 0;  // tokens, sequences, block-table columns, rope rows, blocks
  bool have_scales = false;
};

// Every input's shape against the attributes (in[i] = input i, absent optional inputs have rank -1);
// fills the extents.
void check_shapes(Extents& e, const TensorIn* in, size_t n_outputs) {
  const int64_t H = e.H, Hkv = e.Hkv, D = e.D, BS = e.BS;
  const TensorIn& q = in[kQ];
  if (q.rank != 2) fail(kOp, ": input 'q' must be [T, num_heads*head_size]; got shape ", shape_str(q.shape()));
  const int64_t T = q.dims[0];
  expect(kOp, "q", q, {T, H * D});
  expect(kOp, "k", in[kK], {T, Hkv * D});
  expect(kOp, "v", in[kV], {T, Hkv * D});
  expect(kOp, "positions", in[kPositions], {T});
  const TensorIn& cu = in[kCuSeqlens];
  if (cu.rank != 1 || cu.dims[0] < 1)
    fail(kOp, ": input 'cu_seqlens' must be [S+1] with S >= 0; got shape ", shape_str(cu.shape()));
  const int64_t S = cu.dims[0] - 1;
  expect(kOp, "context_lens", in[kContextLens], {S});
  expect(kOp, "block_tables", in[kBlockTables], {S, -1});
  expect(kOp, "cos_cache", in[kCos], {-1, D / 2});
  const int64_t max_pos = in[kCos].dims[0];
  expect(kOp, "sin_cache", in[kSin], {max_pos, D / 2});
  const TensorIn& kc = in[kKeyCache];
  if (kc.rank != 4)
    fail(kOp, ": input 'key_cache' must be [num_blocks, kv_num_heads, block_size, head_size]; got shape ",
         shape_str(kc.shape()));
  const int64_t NB = kc.dims[0];
  expect(kOp, "key_cache", kc, {NB, Hkv, BS, e.row});
  expect(kOp, "value_cache", in[kValueCache], {NB, Hkv, BS, e.row});
  e.have_scales = in[kKeyScales].value != nullptr && in[kValueScales].value != nullptr;
  if (e.quantized) {
    if (!e.have_scales)
      fail(kOp,
           ": inputs 'key_scales' and 'value_scales' [num_blocks, kv_num_heads, block_size] "
           "are required for kv_dtype int8/fp8_e4m3/int4");
    if (n_outputs < 5)
      fail(kOp,
           ": outputs 'key_scales_out' and 'value_scales_out' are required for kv_dtype "
           "int8/fp8_e4m3/int4");
    expect(kOp, "key_scales", in[kKeyScales], {NB, Hkv, BS});
    expect(kOp, "value_scales", in[kValueScales], {NB, Hkv, BS});
  }
  e.T = T;
  e.S = S;
  e.MB = in[kBlockTables].dims[1];
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

}  // namespace

template <typename CacheT>
PagedAttentionKernel<CacheT>::PagedAttentionKernel(const OrtApi& api, const OrtKernelInfo* info) : api_(api) {
  num_heads_ = attr_int(&api, info, "num_heads", 0);
  kv_heads_ = attr_int(&api, info, "kv_num_heads", 0);
  head_size_ = attr_int(&api, info, "head_size", 0);
  block_size_ = attr_int(&api, info, "block_size", 0);
  const std::string dt = attr_string(&api, info, "kv_dtype", "float32");
  const int64_t interleaved = attr_int(&api, info, "rope_interleaved", 0);
  layer_ = attr_int(&api, info, "layer", -1);
  window_ = attr_int(&api, info, "window", 0);
  interleaved_ = interleaved != 0;
  // the cache tensors' element type each kv_dtype needs
  constexpr const char* cache_type = std::is_same<CacheT, float>::value      ? "float32"
                                     : std::is_same<CacheT, uint16_t>::value ? "float16"
                                                                             : "uint8";
  std::ostringstream err;
  if (dt == "float32") {
    kv_dtype_ = KvDtype::kFloat32;
  } else if (dt == "float16") {
    kv_dtype_ = KvDtype::kFloat16;
  } else if (dt == "int8") {
    kv_dtype_ = KvDtype::kInt8;
  } else if (dt == "fp8_e4m3") {
    kv_dtype_ = KvDtype::kFp8E4M3;
  } else if (dt == "int4") {
    kv_dtype_ = KvDtype::kInt4;
  } else {
    err << kOp << ": attribute kv_dtype = '" << dt << "' is not float32, float16, int8, fp8_e4m3 or int4";
  }
  const bool quantized = kv_has_scales(kv_dtype_);
  const char* needs = kv_dtype_ == KvDtype::kFloat32 ? "float32" : kv_dtype_ == KvDtype::kFloat16 ? "float16" : "uint8";
  rotate_ = attr_int(&api, info, "rotate", quantized ? 1 : 0) != 0;
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
    else if (std::string(needs) != cache_type)
      err << kOp << ": attribute kv_dtype = '" << dt << "' needs " << needs << " key_cache/value_cache tensors; got "
          << cache_type;
    else if (interleaved != 0 && interleaved != 1)
      err << kOp << ": attribute rope_interleaved = " << interleaved << " must be 0 or 1";
    else if (window_ < 0)
      err << kOp << ": attribute window = " << window_ << " must be >= 0 (0: no sliding window)";
  }
  init_error_ = err.str();
  scale_ = attr_float(&api, info, "scale", 0.f);
  if (scale_ == 0.f && head_size_ > 0) scale_ = 1.f / std::sqrt(static_cast<float>(head_size_));
  // The rope tables are initializers in the engine graph: their pointers and shapes are read once here
  // (their shapes are still checked on every call, at no cost).
  for (auto [i, dst] : {std::pair<size_t, TensorIn*>{kCos, &cos_}, {kSin, &sin_}}) {
    int is_constant = 0;
    const OrtValue* value = nullptr;
    if (OrtStatus* st = api.KernelInfoGetConstantInput_tensor(info, i, &is_constant, &value)) {
      api.ReleaseStatus(st);
      continue;
    }
    if (is_constant && value != nullptr) {
      try {
        *dst = describe(api, value);
      } catch (const std::exception&) {
        *dst = TensorIn{};  // read on every call instead
      }
    }
  }
}

template <typename CacheT>
OrtStatusPtr PagedAttentionKernel<CacheT>::ComputeV2(OrtKernelContext* context) {
  const OrtApi& api = api_;
  try {
    if (!init_error_.empty()) throw OpError(init_error_);
    size_t n_inputs = 0, n_outputs = 0;
    check(api, api.KernelContext_GetInputCount(context, &n_inputs));
    check(api, api.KernelContext_GetOutputCount(context, &n_outputs));
    TensorIn in[PagedAttentionOp<CacheT>::kInputs];
    for (size_t i = 0; i < PagedAttentionOp<CacheT>::kInputs; ++i) {
      if (i == kCos && cos_.value) {
        in[i] = cos_;
      } else if (i == kSin && sin_.value) {
        in[i] = sin_;
      } else {
        in[i] = input(api, context, n_inputs, i);
      }
    }
    if (layer_ >= 0) {  // every layer's caches in one input each: this node's layer
      take_layer(in[kKeyCache], "key_cache", layer_, sizeof(CacheT));
      take_layer(in[kValueCache], "value_cache", layer_, sizeof(CacheT));
      take_layer(in[kKeyScales], "key_scales", layer_, sizeof(uint16_t));
      take_layer(in[kValueScales], "value_scales", layer_, sizeof(uint16_t));
    }
    Extents e{num_heads_,
              kv_heads_,
              head_size_,
              block_size_,
              kv_has_scales(kv_dtype_),
              kv_row_bytes(kv_dtype_, head_size_) / static_cast<int64_t>(sizeof(CacheT))};
    check_shapes(e, in, n_outputs);
    const auto* cu = static_cast<const int32_t*>(in[kCuSeqlens].data);
    const auto* pos = static_cast<const int32_t*>(in[kPositions].data);
    const auto* ctxl = static_cast<const int32_t*>(in[kContextLens].data);
    const auto* bt = static_cast<const int32_t*>(in[kBlockTables].data);
    check_values(e, cu, pos, ctxl, bt);

    // The outputs. Aliasing: the engine binds the cache OrtValues as both input and output, so a copy
    // happens only when ORT gave a different buffer.
    const int64_t attn_dims[2] = {e.T, e.H * e.D};
    float* out = output<float>(api, context, kAttn, attn_dims, 2);
    const int64_t cache_elems = e.NB * e.Hkv * e.BS * e.row;
    CacheT* kc = output<CacheT>(api, context, kKeyCacheOut, in[kKeyCache].dims, 4);
    CacheT* vc = output<CacheT>(api, context, kValueCacheOut, in[kKeyCache].dims, 4);
    alias_or_copy(in[kKeyCache].data, kc, cache_elems);
    alias_or_copy(in[kValueCache].data, vc, cache_elems);
    uint16_t* ks = nullptr;
    uint16_t* vs = nullptr;
    if (n_outputs >= 5) {
      // float32 / float16 caches: the scales are unused; passed through when given, else empty tensors.
      const int64_t none = 0;
      const bool have = e.have_scales;
      ks = output<uint16_t>(api, context, kKeyScalesOut, have ? in[kKeyScales].dims : &none, have ? 3 : 1);
      vs = output<uint16_t>(api, context, kValueScalesOut, have ? in[kValueScales].dims : &none, have ? 3 : 1);
      if (have && ks && vs) {
        alias_or_copy(in[kKeyScales].data, ks, e.NB * e.Hkv * e.BS);
        alias_or_copy(in[kValueScales].data, vs, e.NB * e.Hkv * e.BS);
      }
    }
    if (e.quantized && (ks == nullptr || vs == nullptr))
      fail(kOp, ": outputs 'key_scales_out' and 'value_scales_out' are required for kv_dtype int8/fp8_e4m3/int4");
    if (e.T == 0) return nullptr;

    PagedAttentionDims dims{e.T,  e.S,       e.H,       e.Hkv,   e.D,          e.BS,   e.MB,
                            e.NB, e.max_pos, kv_dtype_, rotate_, interleaved_, scale_, window_};
    PagedAttentionArgs args{static_cast<const float*>(in[kQ].data),
                            static_cast<const float*>(in[kK].data),
                            static_cast<const float*>(in[kV].data),
                            pos,
                            cu,
                            ctxl,
                            bt,
                            static_cast<const float*>(in[kCos].data),
                            static_cast<const float*>(in[kSin].data),
                            kc,
                            vc,
                            ks,
                            vs,
                            out};
    paged_attention(dims, args, Parallel{ort_parallel_for, context});
    return nullptr;
  } catch (const OpError& e) {
    return api.CreateStatus(ORT_INVALID_ARGUMENT, e.what());
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_RUNTIME_EXCEPTION, (std::string(kOp) + ": " + e.what()).c_str());
  } catch (...) {
    return api.CreateStatus(ORT_RUNTIME_EXCEPTION, "PagedAttention: unknown error");
  }
}

template <typename CacheT>
OrtStatusPtr PagedAttentionOp<CacheT>::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info,
                                                      void** kernel) const {
  try {
    *kernel = new PagedAttentionKernel<CacheT>(api, info);
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, e.what());
  }
}

template <typename CacheT>
ONNXTensorElementDataType PagedAttentionOp<CacheT>::GetInputType(size_t i) const {
  switch (i) {
    case kPositions:
    case kCuSeqlens:
    case kContextLens:
    case kBlockTables:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case kKeyCache:
    case kValueCache:
      return kCacheType;
    case kKeyScales:
    case kValueScales:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    default:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

template struct PagedAttentionKernel<float>;
template struct PagedAttentionKernel<uint16_t>;
template struct PagedAttentionKernel<uint8_t>;
template struct PagedAttentionOp<float>;
template struct PagedAttentionOp<uint16_t>;
template struct PagedAttentionOp<uint8_t>;

}  // namespace ortllm
