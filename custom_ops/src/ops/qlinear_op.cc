// ORT-facing wrapper of QLinear: attribute and shape validation (every error names the input and
// the bad value; all indices are checked before anything runs), then the pure kernel on the
// session's intra-op pool. No exception leaves ComputeV2.
#include "qlinear_op.h"

#include <cstring>
#include <map>
#include <vector>

namespace ortllm {
namespace {

constexpr const char* kOp = "QLinear";
constexpr int kSegInputs = kQLinearSegInputs;
enum Input {
  kX,
  kCodes,
  kScales,
  kOffsets,
  kResidual,
  kAdapter,
  kLoraScale,
  kSeg0,
  kNormWeight = kSeg0 + kSegInputs * kQLinearMaxSegments
};

OrtStatusPtr make_status(OrtErrorCode code, const std::string& msg) {
  return Ort::GetApi().CreateStatus(code, msg.c_str());
}

using In = QLinearInput;

In describe(const OrtValue* value) {
  In in;
  in.value = value;
  if (value == nullptr) return in;
  auto info = Ort::ConstValue(value).GetTensorTypeAndShapeInfo();
  in.shape = info.GetShape();
  in.type = info.GetElementType();
  return in;
}

In input(Ort::KernelContext& ctx, size_t i) {
  if (i >= ctx.GetInputCount()) return In{};
  return describe(static_cast<const OrtValue*>(ctx.GetInput(i)));
}

template <typename T>
const T* data(const In& in) {
  return Ort::ConstValue(in.value).GetTensorData<T>();
}

void expect_type(const char* name, const In& in, ONNXTensorElementDataType type, const char* type_name) {
  if (in.type != type)
    fail(kOp, ": input '", name, "' must be ", type_name, " (ONNX element type ", type, "); got element type ",
         in.type);
}

}  // namespace

QLinearKernel::QLinearKernel(const OrtApi& api, const OrtKernelInfo* info) {
  K_ = attr_int(&api, info, "K", 0);
  N_ = attr_int(&api, info, "N", 0);
  bits_ = attr_int(&api, info, "bits", 0);
  block_size_ = attr_int(&api, info, "block_size", 0);
  packed_a_ = attr_int(&api, info, "packed_a", 0) != 0;
  norm_eps_ = attr_float(&api, info, "norm_eps", 1e-5f);
  lora_layer_ = attr_int(&api, info, "lora_layer", -1);
  {
    size_t n = 0;
    if (OrtStatus* st = api.KernelInfoGetAttributeArray_int64(info, "split", nullptr, &n)) {
      api.ReleaseStatus(st);
    } else {
      split_.resize(n);
      if (OrtStatus* st2 = api.KernelInfoGetAttributeArray_int64(info, "split", split_.data(), &n)) {
        api.ReleaseStatus(st2);
        split_.clear();
      }
    }
  }
  const std::string epi = attr_string(&api, info, "epilogue", "none");
  std::ostringstream err;
  if (K_ <= 0 || N_ <= 0)
    err << kOp << ": attributes K and N must be > 0; got K = " << K_ << ", N = " << N_;
  else if (bits_ != 4 && bits_ != 8)
    err << kOp << ": attribute bits must be 4 or 8; got " << bits_;
  else if (block_size_ <= 0 || block_size_ % 32 != 0)
    err << kOp << ": attribute block_size must be a positive multiple of 32 (32, 64, 128); got " << block_size_;
  else if (epi == "none")
    epilogue_ = QLinearEpilogue::kNone;
  else if (epi == "residual")
    epilogue_ = QLinearEpilogue::kResidual;
  else if (epi == "swiglu")
    epilogue_ = QLinearEpilogue::kSwiGLU;
  else
    err << kOp << ": attribute epilogue must be \"none\", \"residual\" or \"swiglu\"; got \"" << epi << "\"";
  if (err.str().empty() && epilogue_ == QLinearEpilogue::kSwiGLU && N_ % 16 != 0)
    err << kOp << ": epilogue \"swiglu\" needs N (gate|up) a multiple of 16; got N = " << N_;
  if (err.str().empty() && !split_.empty()) {
    int64_t sum = 0;
    bool positive = true;
    for (int64_t w : split_) sum += w, positive = positive && w > 0;
    if (epilogue_ != QLinearEpilogue::kNone)
      err << kOp << ": attribute split needs epilogue \"none\"";
    else if (split_.size() > static_cast<size_t>(kQLinearMaxOutputs) || !positive || sum != N_)
      err << kOp << ": attribute split must be 1 to " << kQLinearMaxOutputs << " positive widths summing to N = " << N_
          << "; got " << shape_str(split_);
  }
  init_error_ = err.str();
  // The weight, its scales and offsets and the norm weight are initializers: read them (pointer, type, shape)
  // once here instead of on every call. Reading an input's type and shape costs about a microsecond, and a
  // decode step makes ~120 QLinear calls.
  for (size_t i : {static_cast<size_t>(kCodes), static_cast<size_t>(kScales), static_cast<size_t>(kOffsets),
                   static_cast<size_t>(kNormWeight)}) {
    int is_constant = 0;
    const OrtValue* value = nullptr;
    if (OrtStatus* st = api.KernelInfoGetConstantInput_tensor(info, i, &is_constant, &value)) {
      api.ReleaseStatus(st);
      continue;
    }
    if (is_constant && value != nullptr) constant_[i] = describe(value);
  }
}

// An input: the constant read at creation, or this call's.
static In input_of(const std::map<size_t, In>& constant, Ort::KernelContext& ctx, size_t i) {
  const auto it = constant.find(i);
  return it != constant.end() ? it->second : input(ctx, i);
}

OrtStatusPtr QLinearKernel::ComputeV2(OrtKernelContext* context) {
  try {
    if (!init_error_.empty()) return make_status(ORT_INVALID_ARGUMENT, init_error_);
    Ort::KernelContext ctx(context);
    const In x = input(ctx, kX), codes = input_of(constant_, ctx, kCodes), scales = input_of(constant_, ctx, kScales);
    expect_type("x", x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
    if (x.shape.size() != 2) fail(kOp, ": input 'x' must be [T, K]; got shape ", shape_str(x.shape));
    const int64_t T = x.shape[0];
    expect_shape(kOp, "x", x.shape, {T, K_});
    QLinearDims dims{T, K_, N_, block_size_, static_cast<int>(bits_), epilogue_};
    const int64_t G = dims.groups(), kb = dims.k_blocks();
    expect_type("codes", codes, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, "uint8");
    expect_shape(kOp, "codes", codes.shape, {G, kb, block_size_ * bits_});
    expect_type("scales", scales, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
    expect_shape(kOp, "scales", scales.shape, {G, kb, 8});

    QLinearArgs a{};
    a.x = data<float>(x);
    const In norm = input_of(constant_, ctx, kNormWeight);
    if (norm.value) {
      expect_type("norm_weight", norm, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
      expect_shape(kOp, "norm_weight", norm.shape, {K_});
      if (!(norm_eps_ > 0.f)) fail(kOp, ": attribute norm_eps must be > 0; got ", norm_eps_);
      a.norm_weight = data<float>(norm);
      a.norm_eps = norm_eps_;
    }
    a.codes = data<uint8_t>(codes);
    a.d = reinterpret_cast<const uint16_t*>(data<Ort::Float16_t>(scales));
    const In offsets = input_of(constant_, ctx, kOffsets);
    if (offsets.value) {
      expect_type("offsets", offsets, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
      expect_shape(kOp, "offsets", offsets.shape, {G, kb, 8});
      a.m = reinterpret_cast<const uint16_t*>(data<Ort::Float16_t>(offsets));
    }
    const In residual = input(ctx, kResidual);
    if (epilogue_ == QLinearEpilogue::kResidual) {
      if (!residual.value) fail(kOp, ": epilogue \"residual\" needs input 'residual' [T, N]");
      expect_type("residual", residual, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
      expect_shape(kOp, "residual", residual.shape, {T, N_});
      a.residual = data<float>(residual);
    } else if (residual.value) {
      fail(kOp, ": input 'residual' is only read with epilogue \"residual\"; got epilogue without it");
    }

    const In adapter = input(ctx, kAdapter);
    if (adapter.value) {
      expect_type("token_adapter", adapter, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32");
      expect_shape(kOp, "token_adapter", adapter.shape, {T});
      const In lscale = input(ctx, kLoraScale);
      if (!lscale.value) fail(kOp, ": input 'token_adapter' needs input 'lora_scale' [n_slots]");
      expect_type("lora_scale", lscale, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
      if (lscale.shape.size() != 1)
        fail(kOp, ": input 'lora_scale' must be [n_slots]; got shape ", shape_str(lscale.shape));
      const int64_t slots = lscale.shape[0];
      a.token_adapter = data<int32_t>(adapter);
      a.lora_scale = data<float>(lscale);
      a.n_slots = slots;
      a.packed_a = packed_a_;
      bool any = false;
      for (int64_t t = 0; t < T; ++t) {
        if (a.token_adapter[t] < -1 || a.token_adapter[t] >= slots)
          fail(kOp, ": input 'token_adapter'[", t, "] = ", a.token_adapter[t], " is not -1 or a slot in [0, ", slots,
               ")");
        any = any || a.token_adapter[t] >= 0;
      }
      // No token with an adapter (the common decode step): the stacks are neither read nor checked, which
      // saves reading nine tensors' type and shape per call (microseconds each).
      if (!any) a.token_adapter = nullptr;
      int64_t col = 0;
      for (int j = 0; any && j < kQLinearMaxSegments; ++j) {
        const size_t base = kSeg0 + kSegInputs * j;
        const In A = input(ctx, base), sA = input(ctx, base + 1), B = input(ctx, base + 2), sB = input(ctx, base + 3),
                 rank = input(ctx, base + 4);
        if (!A.value && !sA.value && !B.value && !sB.value && !rank.value) continue;
        const std::string js = std::to_string(j), an = "A" + js, san = "A_scale" + js, bn = "B" + js,
                          sbn = "B_scale" + js, rn = "rank" + js;
        if (!A.value || !sA.value || !B.value || !sB.value || !rank.value)
          fail(kOp, ": LoRA segment ", j, " needs all of inputs '", an, "', '", san, "', '", bn, "', '", sbn, "' and '",
               rn, "'");
        expect_type(an.c_str(), A, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, "int8");
        expect_type(san.c_str(), sA, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
        expect_type(bn.c_str(), B, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, "int8");
        expect_type(sbn.c_str(), sB, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
        expect_type(rn.c_str(), rank, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32");
        if (K_ % 4 != 0) fail(kOp, ": a LoRA needs K a multiple of 4 (A's k-quads); got K = ", K_);
        // Stacked [n_layers, ...] (attribute lora_layer picks this node's layer) or one layer's [n_slots, ...].
        const bool stacked = lora_layer_ >= 0;
        const size_t lead = stacked ? 1 : 0;
        if (A.shape.size() != 3 + lead)
          fail(kOp, ": input '", an, "' must be ",
               stacked ? "[n_layers, n_slots, K, r_max] (attribute lora_layer)" : "[n_slots, K, r_max]", "; got shape ",
               shape_str(A.shape));
        const int64_t layers = stacked ? A.shape[0] : 1, r_max = A.shape[2 + lead];
        // this layer's [n_slots, ...] of a stack: its element offset (0 unstacked)
        auto at = [&](const In& in, const std::string& name) {
          return stacked ? layer_offset(kOp, "lora_layer", name.c_str(), in.shape.data(), in.shape.size(), lora_layer_)
                         : 0;
        };
        const int64_t a_at = at(A, an);
        auto dims = [&](std::vector<int64_t> d) {
          if (stacked) d.insert(d.begin(), layers);
          return d;
        };
        expect_shape(kOp, an.c_str(), A.shape, dims({slots, K_, r_max}));
        if (r_max % 2 != 0) fail(kOp, ": input '", an, "' needs an even r_max (B's rank pairs); got ", r_max);
        const int64_t kc = (K_ + kLoraChunk - 1) / kLoraChunk;
        expect_shape(kOp, san.c_str(), sA.shape, dims({slots, kc, r_max}));
        if (B.shape.size() != 3 + lead)
          fail(kOp, ": input '", bn, "' must be ",
               stacked ? "[n_layers, n_slots, r_max, N_j]" : "[n_slots, r_max, N_j]", "; got shape ",
               shape_str(B.shape));
        const int64_t width = B.shape[2 + lead];
        expect_shape(kOp, bn.c_str(), B.shape, dims({slots, r_max, width}));
        expect_shape(kOp, sbn.c_str(), sB.shape, dims({slots, width}));
        expect_shape(kOp, rn.c_str(), rank.shape, {slots});
        const int32_t* rk = data<int32_t>(rank);
        for (int64_t s = 0; s < slots; ++s)
          if (rk[s] < 0 || rk[s] > r_max)
            fail(kOp, ": input '", rn, "'[", s, "] = ", rk[s], " is outside [0, r_max = ", r_max, "]");
        QLinearLoraSegment& sg = a.seg[a.n_segments++];
        sg = {data<int8_t>(A) + a_at,
              reinterpret_cast<const uint16_t*>(data<Ort::Float16_t>(sA)) + at(sA, san),
              data<int8_t>(B) + at(B, bn),
              reinterpret_cast<const uint16_t*>(data<Ort::Float16_t>(sB)) + at(sB, sbn),
              rk,
              r_max,
              col,
              width};
        col += width;
      }
      if (any && a.n_segments == 0)
        fail(kOp, ": input 'token_adapter' needs at least one LoRA segment (A0, A_scale0, B0, B_scale0, rank0)");
      if (any && col != N_)
        fail(kOp, ": the LoRA segments' output widths (B_j's last dims) sum to ", col, "; expected N = ", N_);
    }

    if (split_.size() > 1) {
      if (ctx.GetOutputCount() < split_.size())
        fail(kOp, ": attribute split names ", split_.size(), " outputs; the node has ", ctx.GetOutputCount());
      int64_t col = 0;
      for (size_t j = 0; j < split_.size(); ++j) {
        a.outputs[j] = ctx.GetOutput(j, {T, split_[j]}).GetTensorMutableData<float>();
        a.out_col0[j] = col;
        a.out_width[j] = split_[j];
        col += split_[j];
      }
      a.n_outputs = static_cast<int>(split_.size());
      a.y = a.outputs[0];
    } else {
      a.y = ctx.GetOutput(0, {T, dims.y_cols()}).GetTensorMutableData<float>();
      a.n_outputs = 1;
    }
    if (ctx.GetOutputCount() > kQLinearArgmaxOutput) {  // optional int64 [T]; "" in the node: left out
      const int64_t argmax_dims[1] = {T};
      OrtValue* am = nullptr;
      Ort::ThrowOnError(Ort::GetApi().KernelContext_GetOutput(context, kQLinearArgmaxOutput, argmax_dims, 1, &am));
      if (am != nullptr) {
        if (epilogue_ != QLinearEpilogue::kNone || split_.size() > 1)
          fail(kOp, ": output 'argmax' needs epilogue \"none\" and one output y (no split)");
        a.argmax = Ort::UnownedValue(am).GetTensorMutableData<int64_t>();
      }
    }
    qlinear(dims, a, Parallel{ort_parallel_for, context});
    return nullptr;
  } catch (const OpError& e) {
    return make_status(ORT_INVALID_ARGUMENT, e.what());
  } catch (const std::exception& e) {
    return make_status(ORT_RUNTIME_EXCEPTION, std::string(kOp) + ": " + e.what());
  } catch (...) {
    return make_status(ORT_RUNTIME_EXCEPTION, "QLinear: unknown error");
  }
}

OrtStatusPtr QLinearOp::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
  try {
    *kernel = new QLinearKernel(api, info);
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, e.what());
  }
}

ONNXTensorElementDataType QLinearOp::GetInputType(size_t i) const {
  switch (i) {
    case kX:
    case kResidual:
    case kLoraScale:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case kCodes:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case kScales:
    case kOffsets:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case kAdapter:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case kNormWeight:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    default:  // A_j, A_scale_j, B_j, B_scale_j, rank_j
      switch ((i - kSeg0) % kSegInputs) {
        case 0:
        case 2:
          return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
        case 4:
          return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
        default:
          return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
      }
  }
}

OrtCustomOpInputOutputCharacteristic QLinearOp::GetInputCharacteristic(size_t i) const {
  return i <= kScales ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                      : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
}

}  // namespace ortllm
