// ORT-facing wrapper of MoE: attribute and shape validation (every error names the input and the bad value; the
// expert ids are checked before anything runs), then the pure kernel on the session's intra-op pool. No exception
// leaves ComputeV2.
#include "moe_op.h"

#include <cmath>
#include <string>

#include "../kernels/moe.h"
#include "qlinear_op.h"

namespace ortllm {
namespace {

constexpr const char* kOp = "MoE";
enum Input {
  kX,
  kExpert,
  kWeight,
  kGateUpCodes,
  kGateUpScales,
  kGateUpOffsets,
  kDownCodes,
  kDownScales,
  kDownOffsets,
  kGateUpBias,
  kDownBias
};

constexpr auto F32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, F16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
               U8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, I64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;

// Each expert's gate|up is a QLinear weight of 2I rows over H (gate rows first), its down one of H rows over I, both
// packed (pipeline/qlinear_pack.py) and stacked over the E experts: G = rows / 8 (rounded up), kb = ceil(K / bs).
constexpr InputSpec kInputs[] = {
    {"x", F32, "T, H", false, "the FFN's input (normed), which the router read too"},
    {"expert", I64, "T, k", false, "each token's k experts (the router's top-k ids, in [0, E))"},
    {"weight", F32, "T, k", false, "each of those experts' weight in the token's sum"},
    {"gate_up_codes", U8, "E, 2I/8, ceil(H/bs), block_size*bits", false,
     "the experts' gate rows then up rows (2I), packed codes"},
    {"gate_up_scales", F16, "E, 2I/8, ceil(H/bs), 8", false, "gate_up's d per row and block"},
    {"gate_up_offsets", F16, "E, 2I/8, ceil(H/bs), 8", true, "gate_up's m per row and block: w = d * (q - zp) + m"},
    {"down_codes", U8, "E, ceil(H/8), ceil(I/bs), block_size*bits", false, "the experts' down codes, packed"},
    {"down_scales", F16, "E, ceil(H/8), ceil(I/bs), 8", false, "down's d per row and block"},
    {"down_offsets", F16, "E, ceil(H/8), ceil(I/bs), 8", true, "down's m per row and block"},
    {"gate_up_bias", F32, "E, 2I", true, "the experts' gate then up biases, added before the activation (gpt-oss)"},
    {"down_bias", F32, "E, H", true, "the experts' down biases (gpt-oss)"},
};
static_assert(same_name(kInputs[kGateUpCodes].name, "gate_up_codes") &&
                  same_name(kInputs[kDownBias].name, "down_bias") &&
                  sizeof(kInputs) / sizeof(kInputs[0]) == kDownBias + 1,
              "the enum Input names the table's positions");

constexpr AttrSpec kAttrs[] = {
    {"H", "int", nullptr, "the hidden width (x's, y's)"},
    {"I", "int", nullptr, "an expert's FFN width: a multiple of 8 (gate_up has 2I rows)"},
    {"E", "int", nullptr, "the number of experts"},
    {"bits", "int", nullptr, "the experts' weight bits, both projections: 4 or 8"},
    {"block_size", "int", nullptr, "the quantization block along K, both projections: a multiple of 32"},
    {"activation", "string", "swiglu",
     "swiglu: SiLU(gate) * up; clamped_swiglu (gpt-oss): g = min(gate, limit), u = clamp(up, -limit, limit), "
     "(u + 1) * g * sigmoid(alpha * g)"},
    {"alpha", "float", "1.702", "clamped_swiglu's sigmoid slope"},
    {"limit", "float", "7.0", "clamped_swiglu's clamp, > 0"},
    {"weight_format", "string", "affine",
     "both projections: affine (w = d * (q - zp) + m) or mxfp4 (bits 4, no offsets: w = table[q] * d, QLinear's "
     "2 x e2m1 table; gpt-oss's MXFP4 experts kept exact)"},
};

constexpr OpSchema kSchema{kOp,
                           "y = sum over a token's k experts e of weight * down_e(act(gate_e(x), up_e(x))) (+ the "
                           "experts' biases), the experts' weights block-quantized (int4, int8), tokens grouped by "
                           "expert",
                           kInputs,
                           sizeof(kInputs) / sizeof(kInputs[0]),
                           kAttrs,
                           sizeof(kAttrs) / sizeof(kAttrs[0]),
                           nullptr,
                           nullptr,
                           0};

const ParsedSchema& parsed() {
  static const ParsedSchema p(kSchema);
  return p;
}

struct Symbols {
  int T, H, k, E, G_gu, kb_gu, code_bytes, G_d, kb_d, two_I;
};
const Symbols& symbols() {
  static const Symbols s = [] {
    const ParsedSchema& p = parsed();
    return Symbols{p.sym("T"),
                   p.sym("H"),
                   p.sym("k"),
                   p.sym("E"),
                   p.sym("2I/8"),
                   p.sym("ceil(H/bs)"),
                   p.sym("block_size*bits"),
                   p.sym("ceil(H/8)"),
                   p.sym("ceil(I/bs)"),
                   p.sym("2I")};
  }();
  return s;
}

OrtStatusPtr make_status(OrtErrorCode code, const std::string& msg) {
  return Ort::GetApi().CreateStatus(code, msg.c_str());
}

}  // namespace

const OpSchema& moe_schema() {
  return kSchema;
}

MoeKernel::MoeKernel(const OrtApi& api, const OrtKernelInfo* info, const OpsIsa& isa) : isa_(&isa) {
  H_ = attr_int(&api, info, "H", 0);
  I_ = attr_int(&api, info, "I", 0);
  E_ = attr_int(&api, info, "E", 0);
  bits_ = attr_int(&api, info, "bits", 0);
  block_size_ = attr_int(&api, info, "block_size", 0);
  const std::string act = attr_string(&api, info, "activation", "swiglu");
  alpha_ = attr_float(&api, info, "alpha", 1.702f);
  limit_ = attr_float(&api, info, "limit", 7.f);
  const std::string format_error =
      parse_weight_format(kOp, attr_string(&api, info, "weight_format", "affine"), bits_, &mxfp4_);
  std::ostringstream err;
  if (H_ <= 0 || I_ <= 0 || E_ <= 0)
    err << kOp << ": attributes H, I and E must be > 0; got H = " << H_ << ", I = " << I_ << ", E = " << E_;
  else if (I_ % 8 != 0)
    err << kOp << ": attribute I must be a multiple of 8 (gate|up's SwiGLU pairs 8-row groups); got " << I_;
  else if (bits_ != 4 && bits_ != 8)
    err << kOp << ": attribute bits must be 4 or 8; got " << bits_;
  else if (block_size_ <= 0 || block_size_ % 32 != 0 || block_size_ > kQLinearMaxBlock)
    err << kOp << ": attribute block_size must be a multiple of 32 up to " << kQLinearMaxBlock
        << " (32, 64, 128, 256); got " << block_size_;
  else if (!format_error.empty())
    err << format_error;
  else if (act != "swiglu" && act != "clamped_swiglu")
    err << kOp << ": attribute activation = '" << act << "' is not swiglu or clamped_swiglu";
  else if (!(limit_ > 0.f) || !std::isfinite(limit_) || !std::isfinite(alpha_))
    err << kOp << ": attributes alpha and limit must be finite with limit > 0; got alpha = " << alpha_
        << ", limit = " << limit_;
  activation_ = act == "clamped_swiglu" ? MoeActivation::kClampedSwiGLU : MoeActivation::kSwiGLU;
  init_error_ = err.str();
  for (size_t i = kGateUpCodes; i <= kDownOffsets; ++i) {
    int is_constant = 0;
    const OrtValue* value = nullptr;
    if (OrtStatus* st = api.KernelInfoGetConstantInput_tensor(info, i, &is_constant, &value)) {
      api.ReleaseStatus(st);
      continue;
    }
    if (is_constant && value != nullptr) constant_[i - kGateUpCodes] = describe(api, value);
  }
}

// Weight input i: the initializer read at creation, or this call's.
TensorIn MoeKernel::weight_input(const OrtApi& api, OrtKernelContext* context, size_t n_inputs, size_t i) const {
  const TensorIn& fixed = constant_[i - kGateUpCodes];
  return fixed.value ? fixed : input(api, context, n_inputs, i);
}

OrtStatusPtr MoeKernel::ComputeV2(OrtKernelContext* context) {
  try {
    if (!init_error_.empty()) return make_status(ORT_INVALID_ARGUMENT, init_error_);
    const OrtApi& api = Ort::GetApi();
    size_t n_in = 0;
    check(api, api.KernelContext_GetInputCount(context, &n_in));
    const Symbols& sym = symbols();
    InputCheck check_in(parsed(), false);
    check_in.bind(sym.H, H_);
    check_in.bind(sym.E, E_);
    check_in.bind(sym.G_gu, 2 * I_ / 8);
    check_in.bind(sym.kb_gu, (H_ + block_size_ - 1) / block_size_);
    check_in.bind(sym.code_bytes, block_size_ * bits_);
    check_in.bind(sym.G_d, (H_ + 7) / 8);
    check_in.bind(sym.kb_d, (I_ + block_size_ - 1) / block_size_);
    check_in.bind(sym.two_I, 2 * I_);
    const TensorIn x = input(api, context, n_in, kX), expert = input(api, context, n_in, kExpert),
                   weight = input(api, context, n_in, kWeight);
    check_in.check(kX, x);
    check_in.check(kExpert, expert);
    check_in.check(kWeight, weight);
    const int64_t T = check_in[sym.T], k = check_in[sym.k];
    if (k < 1) fail(kOp, ": input 'expert' [T, k] needs k >= 1; got shape ", shape_str(expert.shape()));
    MoeArgs a{};
    a.x = x.as<float>();
    a.expert = expert.as<int64_t>();
    a.weight = weight.as<float>();
    for (int64_t i = 0; i < T * k; ++i)
      if (a.expert[i] < 0 || a.expert[i] >= E_)
        fail(kOp, ": input 'expert'[", i / k, "][", i % k, "] = ", a.expert[i], " is not an expert in [0, E = ", E_,
             ")");
    MoeWeights* proj[2] = {&a.gate_up, &a.down};
    for (int p = 0; p < 2; ++p) {
      const size_t base = p == 0 ? kGateUpCodes : kDownCodes;
      const TensorIn codes = weight_input(api, context, n_in, base),
                     scales = weight_input(api, context, n_in, base + 1),
                     offsets = weight_input(api, context, n_in, base + 2);
      check_in.check(base, codes);
      check_in.check(base + 1, scales);
      proj[p]->codes = codes.as<uint8_t>();
      proj[p]->d = scales.as<uint16_t>();
      proj[p]->m = check_in.check(base + 2, offsets) ? offsets.as<uint16_t>() : nullptr;
      if (mxfp4_ && proj[p]->m != nullptr)
        fail(kOp, ": input '", kInputs[base + 2].name, "' is not read with weight_format \"mxfp4\"; leave it out");
    }
    const TensorIn gu_bias = input(api, context, n_in, kGateUpBias), down_bias = input(api, context, n_in, kDownBias);
    a.gate_up_bias = check_in.check(kGateUpBias, gu_bias) ? gu_bias.as<float>() : nullptr;
    a.down_bias = check_in.check(kDownBias, down_bias) ? down_bias.as<float>() : nullptr;
    const int64_t out_dims[2] = {T, H_};
    a.y = output<float>(api, context, 0, out_dims, 2);
    const MoeDims dims{T, H_, I_, E_, k, block_size_, static_cast<int>(bits_), mxfp4_, activation_, alpha_, limit_};
    moe(dims, a, Parallel{ort_parallel_for, context}, *isa_);
    return nullptr;
  } catch (const OpError& e) {
    return make_status(ORT_INVALID_ARGUMENT, e.what());
  } catch (const std::exception& e) {
    return make_status(ORT_RUNTIME_EXCEPTION, std::string(kOp) + ": " + e.what());
  } catch (...) {
    return make_status(ORT_RUNTIME_EXCEPTION, "MoE: unknown error");
  }
}

OrtStatusPtr MoeOp::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
  try {
    *kernel = new MoeKernel(api, info, *isa);
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, e.what());
  }
}

}  // namespace ortllm
