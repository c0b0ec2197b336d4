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
  kValueScales,
  kSinks
};
enum Output { kAttn, kKeyCacheOut, kValueCacheOut, kKeyScalesOut, kValueScalesOut };

constexpr auto F32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, F16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
               I32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, CACHE = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
// H = num_heads, Hkv = kv_num_heads, D = head_size, BS = block_size (the attributes); S sequences of T tokens;
// row: a cache row's elements, D (D / 2 for int4: two codes a byte).
constexpr InputSpec kInputs[] = {
    {"q", F32, "T, H*D", false, "the queries, before RoPE"},
    {"k", F32, "T, Hkv*D", false, "the new keys, before RoPE"},
    {"v", F32, "T, Hkv*D", false, "the new values"},
    {"positions", I32, "T", false, "each token's RoPE position, < max_pos"},
    {"cu_seqlens", I32, "S+1", false, "sequence s's tokens are [cu[s], cu[s+1]): cu[0] = 0, non-decreasing, cu[S] = T"},
    {"context_lens", I32, "S", false, "tokens already cached; sequence s's token j goes to slot context_lens[s] + j"},
    {"block_tables", I32, "S, max_blocks", false, "each sequence's cache blocks, in order (the first ones read)"},
    {"cos_cache", F32, "max_pos, D/2", false, "the RoPE table's cosines"},
    {"sin_cache", F32, "max_pos, D/2", false, "the RoPE table's sines"},
    {"key_cache", CACHE, "[n_layers,] num_blocks, Hkv, BS, row", false, "the key pool (float32, float16, or codes)"},
    {"value_cache", CACHE, "[n_layers,] num_blocks, Hkv, BS, row", false, "the value pool, like key_cache"},
    {"key_scales", F16, "[n_layers,] num_blocks, Hkv, BS", true, "each key row's scale (quantized caches only)"},
    {"value_scales", F16, "[n_layers,] num_blocks, Hkv, BS", true, "each value row's scale (quantized caches only)"},
    {"sinks", F32, "H", true,
     "attention sinks (gpt-oss): one logit per query head in each row's softmax denominator, weighting no value"},
};
static_assert(same_name(kInputs[kKeyCache].name, "key_cache") && same_name(kInputs[kSinks].name, "sinks") &&
                  sizeof(kInputs) / sizeof(kInputs[0]) == kSinks + 1,
              "the enum Input names the table's positions");

constexpr AttrSpec kAttrs[] = {
    {"num_heads", "int", nullptr, "H, the query heads"},
    {"kv_num_heads", "int", nullptr, "Hkv, the key/value heads (H a multiple of it)"},
    {"head_size", "int", nullptr, "D, even"},
    {"block_size", "int", nullptr, "BS, the cache rows a block"},
    {"kv_dtype", "string", "float32", "the caches' format: float32, float16, int8, fp8_e4m3 or int4"},
    {"rotate", "int", "1 for quantized caches, else 0", "1: Hadamard on q and k (int4: v too), D a power of two"},
    {"scale", "float", "1/sqrt(D)", "the softmax scale"},
    {"window", "int", "0", "> 0: a query at position p attends to keys p - window + 1 .. p only"},
    {"rope_interleaved", "int", "0", "0: HF rotate_half pairs (i, i + D/2); 1: pairs (2i, 2i + 1)"},
    {"layer", "int", "-1", "with it, the caches and scales hold every layer; the node reads and writes this one"},
};

constexpr ONNXTensorElementDataType kCacheTypes[] = {F32, F16, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8};

constexpr OpSchema kSchema{kOp,
                           "RoPE, then causal GQA attention over a paged KV cache that it writes the new rows into",
                           kInputs,
                           sizeof(kInputs) / sizeof(kInputs[0]),
                           kAttrs,
                           sizeof(kAttrs) / sizeof(kAttrs[0]),
                           "layer",
                           kCacheTypes,
                           sizeof(kCacheTypes) / sizeof(kCacheTypes[0])};

const ParsedSchema& parsed() {
  static const ParsedSchema p(kSchema);
  return p;
}

// The table's symbols the wrapper binds or reads, by id (looked up once).
struct Symbols {
  int T, HD, HkvD, half_D, Hkv, BS, row, S, max_blocks, max_pos, num_blocks, H;
};
const Symbols& symbols() {
  static const Symbols s = [] {
    const ParsedSchema& p = parsed();
    return Symbols{p.sym("T"),   p.sym("H*D"), p.sym("Hkv*D"),      p.sym("D/2"),     p.sym("Hkv"),        p.sym("BS"),
                   p.sym("row"), p.sym("S"),   p.sym("max_blocks"), p.sym("max_pos"), p.sym("num_blocks"), p.sym("H")};
  }();
  return s;
}

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

// Every input's type and shape against the table and the attributes (in[i] = input i, absent optional inputs have
// rank -1; the caches still [n_layers, ...] with attribute layer); fills the extents.
void check_shapes(Extents& e, InputCheck& c, const TensorIn* in, size_t n_outputs) {
  const Symbols& sym = symbols();
  c.bind(sym.HD, e.H * e.D);
  c.bind(sym.HkvD, e.Hkv * e.D);
  c.bind(sym.half_D, e.D / 2);
  c.bind(sym.Hkv, e.Hkv);
  c.bind(sym.BS, e.BS);
  c.bind(sym.row, e.row);
  c.bind(sym.H, e.H);
  for (size_t i = kQ; i <= kCuSeqlens; ++i) c.check(i, in[i]);
  const TensorIn& cu = in[kCuSeqlens];
  if (cu.dims[0] < 1) fail(kOp, ": input 'cu_seqlens' must be [S+1] with S >= 0; got shape ", shape_str(cu.shape()));
  c.bind(sym.S, cu.dims[0] - 1);
  for (size_t i = kContextLens; i <= kValueCache; ++i) c.check(i, in[i]);
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
    c.check(kKeyScales, in[kKeyScales]);
    c.check(kValueScales, in[kValueScales]);
  }
  c.check(kSinks, in[kSinks]);
  e.T = c[sym.T];
  e.S = c[sym.S];
  e.MB = c[sym.max_blocks];
  e.max_pos = c[sym.max_pos];
  e.NB = c[sym.num_blocks];
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

static_assert(sizeof(kInputs) / sizeof(kInputs[0]) == PagedAttentionOp<float>::kInputs, "kInputs is the table's size");

}  // namespace

template <typename CacheT>
PagedAttentionKernel<CacheT>::PagedAttentionKernel(const OrtApi& api, const OrtKernelInfo* info, const OpsIsa& isa)
    : api_(api), isa_(&isa) {
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
  // The rope tables (and the sinks) are initializers in the engine graph: their pointers and shapes are read once here
  // (their shapes are still checked on every call, at no cost).
  for (auto [i, dst] : {std::pair<size_t, TensorIn*>{kCos, &cos_}, {kSin, &sin_}, {kSinks, &sinks_}}) {
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
      } else if (i == kSinks && sinks_.value) {
        in[i] = sinks_;
      } else {
        in[i] = input(api, context, n_inputs, i);
      }
    }
    Extents e{num_heads_,
              kv_heads_,
              head_size_,
              block_size_,
              kv_has_scales(kv_dtype_),
              kv_row_bytes(kv_dtype_, head_size_) / static_cast<int64_t>(sizeof(CacheT))};
    InputCheck c(parsed(), layer_ >= 0, PagedAttentionOp<CacheT>::kCacheType);
    check_shapes(e, c, in, n_outputs);
    if (layer_ >= 0) {  // every layer's caches in one input each: this node's layer
      take_layer(in[kKeyCache], "key_cache", layer_, sizeof(CacheT));
      take_layer(in[kValueCache], "value_cache", layer_, sizeof(CacheT));
      take_layer(in[kKeyScales], "key_scales", layer_, sizeof(uint16_t));
      take_layer(in[kValueScales], "value_scales", layer_, sizeof(uint16_t));
    }
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
                            out,
                            in[kSinks].value ? static_cast<const float*>(in[kSinks].data) : nullptr};
    paged_attention(dims, args, Parallel{ort_parallel_for, context}, *isa_);
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
    *kernel = new PagedAttentionKernel<CacheT>(api, info, *this->isa);
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, e.what());
  }
}

const OpSchema& paged_attention_schema() {
  return kSchema;
}

template struct PagedAttentionKernel<float>;
template struct PagedAttentionKernel<uint16_t>;
template struct PagedAttentionKernel<uint8_t>;
template struct PagedAttentionOp<float>;
template struct PagedAttentionOp<uint16_t>;
template struct PagedAttentionOp<uint8_t>;

}  // namespace ortllm
