// ORT-facing wrapper of QLinear: attribute and shape validation (every error names the input and
// the bad value; all indices are checked before anything runs), then the pure kernel on the
// session's intra-op pool. No exception leaves ComputeV2.
#include "qlinear_op.h"

#include <cmath>
#include <cstring>
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
  kNormWeight = kSeg0 + kSegInputs * kQLinearMaxSegments,
  kDora,
  kDoraScale0,
  kAdapterWeight = kDoraScale0 + kQLinearMaxSegments
};

OrtStatusPtr make_status(OrtErrorCode code, const std::string& msg) {
  return Ort::GetApi().CreateStatus(code, msg.c_str());
}

void expect_type(const char* name, const TensorIn& in, ONNXTensorElementDataType type, const char* type_name) {
  if (in.type != type)
    fail(kOp, ": input '", name, "' must be ", type_name, " (ONNX element type ", type, "); got element type ",
         in.type);
}

// A LoRA segment's inputs by segment, in input order (A_j, A_scale_j, B_j, B_scale_j, rank_j): named here so a
// call builds no strings.
static_assert(kQLinearMaxSegments == 3 && kSegInputs == 5, "kSegNames names 3 segments of 5 inputs");
constexpr const char* kSegNames[kQLinearMaxSegments][kSegInputs] = {{"A0", "A_scale0", "B0", "B_scale0", "rank0"},
                                                                    {"A1", "A_scale1", "B1", "B_scale1", "rank1"},
                                                                    {"A2", "A_scale2", "B2", "B_scale2", "rank2"}};

constexpr const char* kDoraScaleNames[kQLinearMaxSegments] = {"dora_scale0", "dora_scale1", "dora_scale2"};

// in's shape must be [n_layers (stacked only), rest...] (op_util.h expect).
void expect_stack(const char* name, const TensorIn& in, bool stacked, int64_t layers,
                  std::initializer_list<int64_t> rest) {
  int64_t want[TensorIn::kMaxRank];
  size_t n = 0;
  if (stacked) want[n++] = layers;
  for (int64_t w : rest) want[n++] = w;
  expect(kOp, name, in, want, n);
}

}  // namespace

QLinearKernel::QLinearKernel(const OrtApi& api, const OrtKernelInfo* info) {
  K_ = attr_int(&api, info, "K", 0);
  N_ = attr_int(&api, info, "N", 0);
  bits_ = attr_int(&api, info, "bits", 0);
  block_size_ = attr_int(&api, info, "block_size", 0);
  act_bits_ = attr_int(&api, info, "act_bits", 8);
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
  else if (act_bits_ != 8 && act_bits_ != 16)
    err << kOp << ": attribute act_bits must be 8 or 16; got " << act_bits_;
  else if (act_bits_ == 16 && (bits_ != 8 || block_size_ > 128))
    err << kOp << ": attribute act_bits = 16 needs bits = 8 and block_size <= 128 (int16 x int8 dots summed in int32); "
        << "got bits = " << bits_ << ", block_size = " << block_size_;
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
    if (is_constant && value != nullptr) constant_[constant_slot(i)] = describe(api, value);
  }
}

size_t QLinearKernel::constant_slot(size_t input) {
  switch (input) {
    case kCodes:
      return 0;
    case kScales:
      return 1;
    case kOffsets:
      return 2;
    default:  // kNormWeight
      return 3;
  }
}

// Input i (codes, scales, offsets or norm_weight): the initializer read at creation, or this call's.
TensorIn QLinearKernel::input_of(const OrtApi& api, OrtKernelContext* context, size_t n_inputs, size_t i) const {
  const TensorIn& fixed = constant_[constant_slot(i)];
  return fixed.value ? fixed : input(api, context, n_inputs, i);
}

OrtStatusPtr QLinearKernel::ComputeV2(OrtKernelContext* context) {
  try {
    if (!init_error_.empty()) return make_status(ORT_INVALID_ARGUMENT, init_error_);
    const OrtApi& api = Ort::GetApi();
    size_t n_in = 0, n_out = 0;
    check(api, api.KernelContext_GetInputCount(context, &n_in));
    check(api, api.KernelContext_GetOutputCount(context, &n_out));
    const TensorIn x = input(api, context, n_in, kX), codes = input_of(api, context, n_in, kCodes),
                   scales = input_of(api, context, n_in, kScales);
    expect_type("x", x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
    if (x.rank != 2) fail(kOp, ": input 'x' must be [T, K]; got shape ", shape_str(x.shape()));
    const int64_t T = x.dims[0];
    expect(kOp, "x", x, {T, K_});
    QLinearDims dims{T, K_, N_, block_size_, static_cast<int>(bits_), epilogue_, static_cast<int>(act_bits_)};
    const int64_t G = dims.groups(), kb = dims.k_blocks();
    expect_type("codes", codes, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, "uint8");
    expect(kOp, "codes", codes, {G, kb, block_size_ * bits_});
    expect_type("scales", scales, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
    expect(kOp, "scales", scales, {G, kb, 8});

    QLinearArgs a{};
    a.x = x.as<float>();
    const TensorIn norm = input_of(api, context, n_in, kNormWeight);
    if (norm.value) {
      expect_type("norm_weight", norm, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
      expect(kOp, "norm_weight", norm, {K_});
      if (!(norm_eps_ > 0.f)) fail(kOp, ": attribute norm_eps must be > 0; got ", norm_eps_);
      a.norm_weight = norm.as<float>();
      a.norm_eps = norm_eps_;
    }
    a.codes = codes.as<uint8_t>();
    a.d = scales.as<uint16_t>();
    const TensorIn offsets = input_of(api, context, n_in, kOffsets);
    if (offsets.value) {
      expect_type("offsets", offsets, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
      expect(kOp, "offsets", offsets, {G, kb, 8});
      a.m = offsets.as<uint16_t>();
    }
    const TensorIn residual = input(api, context, n_in, kResidual);
    if (epilogue_ == QLinearEpilogue::kResidual) {
      if (!residual.value) fail(kOp, ": epilogue \"residual\" needs input 'residual' [T, N]");
      expect_type("residual", residual, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
      expect(kOp, "residual", residual, {T, N_});
      a.residual = residual.as<float>();
    } else if (residual.value) {
      fail(kOp, ": input 'residual' is only read with epilogue \"residual\"; got epilogue without it");
    }

    const TensorIn adapter = input(api, context, n_in, kAdapter);
    if (adapter.value) {
      expect_type("token_adapter", adapter, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32");
      // [T]: one slot a token; [T, M]: up to M <= 4 slots a token, mixed with the weights of input
      // 'token_adapter_weight' [T, M] (1 without it)
      if (adapter.rank == 2 && (adapter.dims[1] < 1 || adapter.dims[1] > kQLinearMaxTerms))
        fail(kOp, ": input 'token_adapter' [T, M] needs M in [1, ", kQLinearMaxTerms, "]; got shape ",
             shape_str(adapter.shape()));
      const int64_t M = adapter.rank == 2 ? adapter.dims[1] : 1;
      if (adapter.rank == 2)
        expect(kOp, "token_adapter", adapter, {T, M});
      else
        expect(kOp, "token_adapter", adapter, {T});
      a.adapter_terms = M;
      const TensorIn weight = input(api, context, n_in, kAdapterWeight);
      if (weight.value) {
        expect_type("token_adapter_weight", weight, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
        if (adapter.rank == 2)
          expect(kOp, "token_adapter_weight", weight, {T, M});
        else
          expect(kOp, "token_adapter_weight", weight, {T});
        a.adapter_weight = weight.as<float>();
      }
      const TensorIn lscale = input(api, context, n_in, kLoraScale);
      if (!lscale.value) fail(kOp, ": input 'token_adapter' needs input 'lora_scale' [n_slots]");
      expect_type("lora_scale", lscale, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
      if (lscale.rank != 1) fail(kOp, ": input 'lora_scale' must be [n_slots]; got shape ", shape_str(lscale.shape()));
      const int64_t slots = lscale.dims[0];
      a.token_adapter = adapter.as<int32_t>();
      a.lora_scale = lscale.as<float>();
      a.n_slots = slots;
      a.packed_a = packed_a_;
      bool any = false;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < M; ++k) {
          const int32_t s = a.token_adapter[t * M + k];
          if (s < -1 || s >= slots) {
            if (M == 1 && adapter.rank == 1)
              fail(kOp, ": input 'token_adapter'[", t, "] = ", s, " is not -1 or a slot in [0, ", slots, ")");
            fail(kOp, ": input 'token_adapter'[", t, "][", k, "] = ", s, " is not -1 or a slot in [0, ", slots, ")");
          }
          if (s >= 0 && k > 0 && a.token_adapter[t * M + k - 1] < 0)
            fail(kOp, ": input 'token_adapter'[", t, "][", k, "] = ", s,
                 " follows a -1 in its row; a row's slots come first, then its -1s");
          if (a.adapter_weight != nullptr && !std::isfinite(a.adapter_weight[t * M + k]))
            fail(kOp, ": input 'token_adapter_weight'[", t, "][", k, "] = ", a.adapter_weight[t * M + k],
                 " is not a finite number");
          any = any || s >= 0;
        }
      // No token with an adapter (the common decode step): the stacks are neither read nor checked, which
      // saves reading nine tensors' type and shape per call (microseconds each).
      if (!any) a.token_adapter = nullptr;
      // DoRA: the scales are read only when a token of this call has a slot flagged in 'dora' (LoRA-only batches
      // read the flag alone)
      const TensorIn dora = any ? input(api, context, n_in, kDora) : TensorIn{};
      const int32_t* dora_flag = nullptr;
      bool any_dora = false;
      if (dora.value) {
        expect_type("dora", dora, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32");
        expect(kOp, "dora", dora, {slots});
        dora_flag = dora.as<int32_t>();
        for (int64_t s = 0; s < slots; ++s)
          if (dora_flag[s] != 0 && dora_flag[s] != 1)
            fail(kOp, ": input 'dora'[", s, "] = ", dora_flag[s], " is not 0 or 1");
        for (int64_t t = 0; t < T; ++t)
          for (int64_t k = 0; k < M; ++k) {
            const int64_t e = t * M + k;
            const int32_t s = a.token_adapter[e];
            if (s < 0 || !dora_flag[s]) continue;
            any_dora = true;
            if (M > 1 && a.token_adapter[t * M + (k == 0 ? 1 : 0)] >= 0)
              fail(kOp, ": input 'token_adapter'[", t, "][", k, "] = ", s,
                   " is a DoRA slot (input 'dora') in a row that mixes adapters; DoRA adapters are not mixed");
            if (a.adapter_weight != nullptr && a.adapter_weight[e] != 1.f)
              fail(kOp, ": input 'token_adapter_weight'[", t, "][", k, "] = ", a.adapter_weight[e],
                   " weighs a DoRA slot (input 'dora'); DoRA adapters take weight 1 only");
          }
      }
      int64_t col = 0;
      for (int j = 0; any && j < kQLinearMaxSegments; ++j) {
        const size_t base = kSeg0 + kSegInputs * j;
        const TensorIn A = input(api, context, n_in, base), sA = input(api, context, n_in, base + 1),
                       B = input(api, context, n_in, base + 2), sB = input(api, context, n_in, base + 3),
                       rank = input(api, context, n_in, base + 4);
        if (!A.value && !sA.value && !B.value && !sB.value && !rank.value) continue;
        const char* const* nm = kSegNames[j];  // A_j, A_scale_j, B_j, B_scale_j, rank_j
        if (!A.value || !sA.value || !B.value || !sB.value || !rank.value)
          fail(kOp, ": LoRA segment ", j, " needs all of inputs '", nm[0], "', '", nm[1], "', '", nm[2], "', '", nm[3],
               "' and '", nm[4], "'");
        expect_type(nm[0], A, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, "int8");
        expect_type(nm[1], sA, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
        expect_type(nm[2], B, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, "int8");
        expect_type(nm[3], sB, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16");
        expect_type(nm[4], rank, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32");
        if (K_ % 4 != 0) fail(kOp, ": a LoRA needs K a multiple of 4 (A's k-quads); got K = ", K_);
        // Stacked [n_layers, ...] (attribute lora_layer picks this node's layer) or one layer's [n_slots, ...].
        const bool stacked = lora_layer_ >= 0;
        const int lead = stacked ? 1 : 0;
        if (A.rank != 3 + lead)
          fail(kOp, ": input '", nm[0], "' must be ",
               stacked ? "[n_layers, n_slots, K, r_max] (attribute lora_layer)" : "[n_slots, K, r_max]", "; got shape ",
               shape_str(A.shape()));
        const int64_t layers = stacked ? A.dims[0] : 1, r_max = A.dims[2 + lead];
        // this layer's [n_slots, ...] of a stack: its element offset (0 unstacked)
        auto at = [&](const TensorIn& in, const char* name) {
          return stacked ? layer_offset(kOp, "lora_layer", name, in.dims, static_cast<size_t>(in.rank), lora_layer_)
                         : 0;
        };
        const int64_t a_at = at(A, nm[0]);
        expect_stack(nm[0], A, stacked, layers, {slots, K_, r_max});
        if (r_max % 4 != 0)
          fail(kOp, ": input '", nm[0], "' needs r_max a multiple of 4 (B's rank quads); got ", r_max);
        const int64_t kc = (K_ + kLoraChunk - 1) / kLoraChunk;
        expect_stack(nm[1], sA, stacked, layers, {slots, kc, r_max});
        if (B.rank != 3 + lead)
          fail(kOp, ": input '", nm[2], "' must be ",
               stacked ? "[n_layers, n_slots, r_max, N_j]" : "[n_slots, r_max, N_j]", "; got shape ",
               shape_str(B.shape()));
        const int64_t width = B.dims[2 + lead];
        expect_stack(nm[2], B, stacked, layers, {slots, r_max, width});
        expect_stack(nm[3], sB, stacked, layers, {slots, width});
        expect(kOp, nm[4], rank, {slots});
        const int32_t* rk = rank.as<int32_t>();
        for (int64_t s = 0; s < slots; ++s)
          if (rk[s] < 0 || rk[s] > r_max)
            fail(kOp, ": input '", nm[4], "'[", s, "] = ", rk[s], " is outside [0, r_max = ", r_max, "]");
        // DoRA rows' scales on this segment, read where a slot is flagged in 'dora' (checked below)
        const TensorIn dscale = any_dora ? input(api, context, n_in, kDoraScale0 + j) : TensorIn{};
        if (dscale.value) {
          expect_type(kDoraScaleNames[j], dscale, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32");
          if (dscale.rank != 2 + lead)
            fail(kOp, ": input '", kDoraScaleNames[j], "' must be ",
                 stacked ? "[n_layers, n_slots, N_j]" : "[n_slots, N_j]", "; got shape ", shape_str(dscale.shape()));
          expect_stack(kDoraScaleNames[j], dscale, stacked, layers, {slots, width});
          a.dora_scale[a.n_segments] = dscale.as<float>() + at(dscale, kDoraScaleNames[j]);
        }
        QLinearLoraSegment& sg = a.seg[a.n_segments++];
        sg = {A.as<int8_t>() + a_at,
              sA.as<uint16_t>() + at(sA, nm[1]),
              B.as<int8_t>() + at(B, nm[2]),
              sB.as<uint16_t>() + at(sB, nm[3]),
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
      for (int j = 0; any_dora && j < a.n_segments; ++j)
        if (a.dora_scale[j] == nullptr)
          fail(kOp, ": a token of a slot flagged in input 'dora' needs input '", kDoraScaleNames[j], "'");
      if (any_dora) a.dora = dora_flag;
    }

    if (split_.size() > 1) {
      if (n_out < split_.size()) fail(kOp, ": attribute split names ", split_.size(), " outputs; the node has ", n_out);
      int64_t col = 0;
      for (size_t j = 0; j < split_.size(); ++j) {
        const int64_t out_dims[2] = {T, split_[j]};
        a.outputs[j] = output<float>(api, context, j, out_dims, 2);
        a.out_col0[j] = col;
        a.out_width[j] = split_[j];
        col += split_[j];
      }
      a.n_outputs = static_cast<int>(split_.size());
      a.y = a.outputs[0];
    } else {
      const int64_t out_dims[2] = {T, dims.y_cols()};
      a.y = output<float>(api, context, 0, out_dims, 2);
      a.n_outputs = 1;
    }
    if (n_out > kQLinearArgmaxOutput) {  // optional int64 [T]; "" in the node: left out
      const int64_t argmax_dims[1] = {T};
      if (int64_t* am = output<int64_t>(api, context, kQLinearArgmaxOutput, argmax_dims, 1)) {
        if (epilogue_ != QLinearEpilogue::kNone || split_.size() > 1)
          fail(kOp, ": output 'argmax' needs epilogue \"none\" and one output y (no split)");
        a.argmax = am;
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
    case kDora:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case kDoraScale0:
    case kDoraScale0 + 1:
    case kDoraScale0 + 2:
    case kAdapterWeight:
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
