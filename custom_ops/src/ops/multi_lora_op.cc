// ORT-facing wrapper of MultiLoRA: shape/index validation (every error names the input and the
// bad value), output aliasing (copy base_y only when y is another buffer), then the pure kernels
// (the optional block offsets, then the adapters, then DoRA rows' scales) on the session's intra-op pool.
#include "multi_lora_op.h"

#include <cmath>
#include <cstring>

#include "../kernels/block_offsets.h"
#include "../kernels/multi_lora.h"

namespace ortllm {
namespace {

constexpr const char* kOp = "MultiLoRA";
enum Input { kX, kBaseY, kA, kB, kScale, kRank, kAdapter, kOffsets, kDora, kDoraScale, kAdapterWeight };
constexpr int64_t kMaxTerms = 4;  // adapters one token may mix (token_adapter [T, M])

void expect_type(const char* name, const TensorIn& in, ONNXTensorElementDataType type, const char* type_name) {
  if (in.type != type)
    fail(kOp, ": input '", name, "' must be ", type_name, " (ONNX element type ", type, "); got element type ",
         in.type);
}

}  // namespace

MultiLoraKernel::MultiLoraKernel(const OrtApi& api, const OrtKernelInfo* info)
    : block_size_(attr_int(&api, info, "block_size", 0)),
      packed_a_(attr_int(&api, info, "packed_a", 0) != 0),
      lora_layer_(attr_int(&api, info, "lora_layer", -1)) {}

OrtStatusPtr MultiLoraKernel::ComputeV2(OrtKernelContext* ctx) {
  const OrtApi& api = Ort::GetApi();
  try {
    size_t n_in = 0;
    check(api, api.KernelContext_GetInputCount(ctx, &n_in));
    const TensorIn x = input(api, ctx, n_in, kX), base_y = input(api, ctx, n_in, kBaseY), A = input(api, ctx, n_in, kA),
                   B = input(api, ctx, n_in, kB), scale = input(api, ctx, n_in, kScale),
                   rank = input(api, ctx, n_in, kRank), token_adapter = input(api, ctx, n_in, kAdapter);
    expect_type("x", x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
    expect_type("base_y", base_y, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
    expect_type("A", A, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
    expect_type("B", B, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
    expect_type("scale", scale, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
    expect_type("rank", rank, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32");
    expect_type("token_adapter", token_adapter, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32");
    if (x.rank != 2) fail(kOp, ": input 'x' must be [T, in]; got shape ", shape_str(x.shape()));
    const int64_t T = x.dims[0], in = x.dims[1];
    if (A.rank != 3) fail(kOp, ": input 'A' must be [n_slots, in, r_max]; got shape ", shape_str(A.shape()));
    const int64_t n_slots = A.dims[0], r_max = A.dims[2];
    expect_shape(kOp, "A", A.shape(), {-1, in, -1});
    if (base_y.rank != 2) fail(kOp, ": input 'base_y' must be [T, out]; got shape ", shape_str(base_y.shape()));
    const int64_t out = base_y.dims[1];
    expect_shape(kOp, "base_y", base_y.shape(), {T, out});
    expect_shape(kOp, "B", B.shape(), {n_slots, r_max, out});
    expect_shape(kOp, "scale", scale.shape(), {n_slots});
    expect_shape(kOp, "rank", rank.shape(), {n_slots});
    // [T], or [T, M] (ops ABI 14): up to M <= 4 slots a token, mixed with input 'token_adapter_weight' (1 without)
    if (token_adapter.rank == 2 && (token_adapter.dims[1] < 1 || token_adapter.dims[1] > kMaxTerms))
      fail(kOp, ": input 'token_adapter' [T, M] needs M in [1, ", kMaxTerms, "]; got shape ",
           shape_str(token_adapter.shape()));
    const int64_t M = token_adapter.rank == 2 ? token_adapter.dims[1] : 1;
    expect_shape(kOp, "token_adapter", token_adapter.shape(),
                 token_adapter.rank == 2 ? std::vector<int64_t>{T, M} : std::vector<int64_t>{T});
    const TensorIn weight = input(api, ctx, n_in, kAdapterWeight);
    const float* w = nullptr;
    if (weight.value) {
      expect_type("token_adapter_weight", weight, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
      expect_shape(kOp, "token_adapter_weight", weight.shape(),
                   token_adapter.rank == 2 ? std::vector<int64_t>{T, M} : std::vector<int64_t>{T});
      w = weight.as<float>();
    }
    const int32_t* rk = rank.as<int32_t>();
    for (int64_t s = 0; s < n_slots; ++s)
      if (rk[s] < 0 || rk[s] > r_max)
        fail(kOp, ": input 'rank'[", s, "] = ", rk[s], " is outside [0, r_max = ", r_max, "]");
    const int32_t* ta = token_adapter.as<int32_t>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < M; ++k) {
        const int32_t s = ta[t * M + k];
        if (s < -1 || s >= n_slots) {
          if (token_adapter.rank == 1)
            fail(kOp, ": input 'token_adapter'[", t, "] = ", s, " is not -1 or a slot in [0, ", n_slots, ")");
          fail(kOp, ": input 'token_adapter'[", t, "][", k, "] = ", s, " is not -1 or a slot in [0, ", n_slots, ")");
        }
        if (s >= 0 && k > 0 && ta[t * M + k - 1] < 0)
          fail(kOp, ": input 'token_adapter'[", t, "][", k, "] = ", s,
               " follows a -1 in its row; a row's slots come first, then its -1s");
        if (w != nullptr && !std::isfinite(w[t * M + k]))
          fail(kOp, ": input 'token_adapter_weight'[", t, "][", k, "] = ", w[t * M + k], " is not a finite number");
      }

    const TensorIn offsets = input(api, ctx, n_in, kOffsets);
    const uint16_t* off = nullptr;
    if (offsets.value) {
      expect_type("offsets", offsets, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
      if (block_size_ <= 0)
        fail(kOp, ": input 'offsets' needs attribute block_size > 0; got block_size = ", block_size_);
      expect_shape(kOp, "offsets", offsets.shape(), {(in + block_size_ - 1) / block_size_, out});
      off = offsets.as<uint16_t>();  // fp16 bits
    }

    // DoRA: the scales are read only when a token of this call has a flagged slot
    const TensorIn dora = input(api, ctx, n_in, kDora);
    const int32_t* dflag = nullptr;
    const float* g = nullptr;
    if (dora.value) {
      expect_type("dora", dora, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32");
      expect_shape(kOp, "dora", dora.shape(), {n_slots});
      const int32_t* f = dora.as<int32_t>();
      bool used = false;
      for (int64_t s = 0; s < n_slots; ++s)
        if (f[s] != 0 && f[s] != 1) fail(kOp, ": input 'dora'[", s, "] = ", f[s], " is not 0 or 1");
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < M; ++k) {
          const int64_t e = t * M + k;
          if (ta[e] < 0 || f[ta[e]] == 0) continue;
          used = true;
          if (M > 1 && ta[t * M + (k == 0 ? 1 : 0)] >= 0)
            fail(kOp, ": input 'token_adapter'[", t, "][", k, "] = ", ta[e],
                 " is a DoRA slot (input 'dora') in a row that mixes adapters; DoRA adapters are not mixed");
          if (w != nullptr && w[e] != 1.f)
            fail(kOp, ": input 'token_adapter_weight'[", t, "][", k, "] = ", w[e],
                 " weighs a DoRA slot (input 'dora'); DoRA adapters take weight 1 only");
        }
      if (used) {
        const TensorIn gs = input(api, ctx, n_in, kDoraScale);
        if (!gs.value) fail(kOp, ": a token of a slot flagged in input 'dora' needs input 'dora_scale'");
        expect_type("dora_scale", gs, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
        const bool stacked = lora_layer_ >= 0;
        if (gs.rank != (stacked ? 3 : 2))
          fail(kOp, ": input 'dora_scale' must be ",
               stacked ? "[n_layers, n_slots, out] (attribute lora_layer)" : "[n_slots, out]", "; got shape ",
               shape_str(gs.shape()));
        expect_shape(kOp, "dora_scale", gs.shape(),
                     stacked ? std::vector<int64_t>{-1, n_slots, out} : std::vector<int64_t>{n_slots, out});
        const int64_t at =
            stacked ? layer_offset(kOp, "lora_layer", "dora_scale", gs.dims, static_cast<size_t>(gs.rank), lora_layer_)
                    : 0;
        dflag = f;
        g = gs.as<float>() + at;
      }
    }

    const int64_t y_dims[2] = {T, out};
    float* yp = output<float>(api, ctx, 0, y_dims, 2);
    const float* bp = base_y.as<float>();
    if (yp != bp && T * out > 0) std::memcpy(yp, bp, sizeof(float) * static_cast<size_t>(T * out));
    if (T == 0 || out == 0) return nullptr;

    Parallel par{ort_parallel_for, ctx};
    if (off != nullptr) add_block_offsets({T, in, out, block_size_}, x.as<float>(), off, yp, par);
    MultiLoraDims dims{T, in, out, n_slots, r_max, packed_a_};
    MultiLoraArgs args{x.as<float>(), A.as<uint16_t>(), B.as<uint16_t>(), scale.as<float>(), rk, ta, yp, M, w};
    multi_lora(dims, args, par);
    if (dflag != nullptr) dora_scale_rows(dims, args, dflag, g);
    return nullptr;
  } catch (const OpError& e) {
    return api.CreateStatus(ORT_INVALID_ARGUMENT, e.what());
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_RUNTIME_EXCEPTION, (std::string(kOp) + ": " + e.what()).c_str());
  } catch (...) {
    return api.CreateStatus(ORT_RUNTIME_EXCEPTION, "MultiLoRA: unknown error");
  }
}

OrtStatusPtr MultiLoraOp::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
  try {
    *kernel = new MultiLoraKernel(api, info);
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, e.what());
  }
}

ONNXTensorElementDataType MultiLoraOp::GetInputType(size_t i) const {
  switch (i) {
    case kA:
    case kB:
    case kOffsets:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case kRank:
    case kAdapter:
    case kDora:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    default:  // x, base_y, scale, dora_scale, token_adapter_weight
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

}  // namespace ortllm
