// ORT-facing wrapper of QLinear: attribute and shape validation (every error names the input and
// the bad value; all indices are checked before anything runs), then the pure kernel on the
// session's intra-op pool. No exception leaves ComputeV2.
#include "qlinear_op.h"

#include <cmath>
#include <cstring>
#include <utility>
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

constexpr auto F32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, F16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
               U8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, I8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8,
               I32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;

// Segment j of the LoRA (j < kQLinearMaxSegments) covers output columns [N_0 + .. + N_{j-1}, + N_j); present
// segments cover N exactly; r_max and N_j are each segment's own. G = ceil(N / 8) row groups, kb = ceil(K /
// block_size) blocks (the packed layout).
constexpr InputSpec kInputs[] = {
    {"x", F32, "T, K", false, "the activations"},
    {"codes", U8, "G, kb, block_size*bits", false, "the weight's codes, packed (qlinear_pack: G row groups of 8)"},
    {"scales", F16, "G, kb, 8", false, "d per row and block"},
    {"offsets", F16, "G, kb, 8", true, "m per row and block: w = d * (q - zp) + m"},
    {"residual", F32, "T, N", true, "with epilogue \"residual\": y = residual + x W^T (y may take its buffer)"},
    {"token_adapter", I32, "T | T, M", true, "-1 or a slot a token; [T, M] (M <= 4): a mix, a row's -1s last"},
    {"lora_scale", F32, "n_slots", true, "each slot's LoRA scale (alpha / r), with token_adapter"},
    {"A0", I8, "[n_layers,] n_slots, K, r_max", true, "LoRA segment 0's A codes, in k-quads (K, r_max multiples of 4)"},
    {"A_scale0", F16, "[n_layers,] n_slots, ceil(K/32), r_max", true, "A0's scales, one per 32 rows of K"},
    {"B0", I8, "[n_layers,] n_slots, r_max, N_j", true, "segment 0's B codes, in rank quads"},
    {"B_scale0", F16, "[n_layers,] n_slots, N_j", true, "B0's scales, one per output column"},
    {"rank0", I32, "n_slots", true, "each slot's rank on segment 0, in [0, r_max]"},
    {"A1", I8, "[n_layers,] n_slots, K, r_max", true, "LoRA segment 1's A codes, in k-quads (K, r_max multiples of 4)"},
    {"A_scale1", F16, "[n_layers,] n_slots, ceil(K/32), r_max", true, "A1's scales, one per 32 rows of K"},
    {"B1", I8, "[n_layers,] n_slots, r_max, N_j", true, "segment 1's B codes, in rank quads"},
    {"B_scale1", F16, "[n_layers,] n_slots, N_j", true, "B1's scales, one per output column"},
    {"rank1", I32, "n_slots", true, "each slot's rank on segment 1, in [0, r_max]"},
    {"A2", I8, "[n_layers,] n_slots, K, r_max", true, "LoRA segment 2's A codes, in k-quads (K, r_max multiples of 4)"},
    {"A_scale2", F16, "[n_layers,] n_slots, ceil(K/32), r_max", true, "A2's scales, one per 32 rows of K"},
    {"B2", I8, "[n_layers,] n_slots, r_max, N_j", true, "segment 2's B codes, in rank quads"},
    {"B_scale2", F16, "[n_layers,] n_slots, N_j", true, "B2's scales, one per output column"},
    {"rank2", I32, "n_slots", true, "each slot's rank on segment 2, in [0, r_max]"},
    {"norm_weight", F32, "K", true, "y is computed from RMSNorm(x) * norm_weight (eps: attribute norm_eps)"},
    {"dora", I32, "n_slots", true, "1 where the slot holds a DoRA adapter, else 0"},
    {"dora_scale0", F32, "[n_layers,] n_slots, N_j", true, "segment 0's per-column scale of a DoRA row"},
    {"dora_scale1", F32, "[n_layers,] n_slots, N_j", true, "segment 1's per-column scale of a DoRA row"},
    {"dora_scale2", F32, "[n_layers,] n_slots, N_j", true, "segment 2's per-column scale of a DoRA row"},
    {"token_adapter_weight", F32, "T | T, M", true, "each term's weight in a token's mix (1 without it)"},
};
static_assert(kQLinearMaxSegments == 3 && kSegInputs == 5, "the table declares 3 segments of 5 inputs");
static_assert(same_name(kInputs[kSeg0 + kSegInputs].name, "A1") &&
                  same_name(kInputs[kNormWeight].name, "norm_weight") &&
                  same_name(kInputs[kDoraScale0].name, "dora_scale0") &&
                  same_name(kInputs[kAdapterWeight].name, "token_adapter_weight") &&
                  sizeof(kInputs) / sizeof(kInputs[0]) == kAdapterWeight + 1,
              "the enum Input names the table's positions");

constexpr AttrSpec kAttrs[] = {
    {"K", "int", nullptr, "the input width"},
    {"N", "int", nullptr, "the output width (every segment's)"},
    {"bits", "int", nullptr, "the weight's bits: 4 or 8"},
    {"block_size", "int", nullptr, "the quantization block along K: a multiple of 32"},
    {"epilogue", "string", "none",
     "\"none\", \"residual\" (adds input residual), \"swiglu\" (SiLU(gate) * up) or \"geglu\" (GELU-tanh(gate) * up)"},
    {"packed_a", "int", "0", "1: slot s of A_j holds a row-major [K, rank_j[s]] matrix"},
    {"norm_eps", "float", "1e-5", "the RMSNorm's epsilon, with norm_weight"},
    {"split", "ints", "[] (one output)",
     "epilogue \"none\": the outputs' widths, summing to N (q, k, v without a Split)"},
    {"act_bits", "int", "8", "16: x as int16 codes per block (bits 8, block_size <= 128); a LoRA reads int8 codes"},
    {"lora_layer", "int", "-1", "with it, A_j, A_scale_j, B_j, B_scale_j, dora_scale_j hold every layer"},
    {"weight_format", "string", "affine",
     "affine: w = d * (q - zp) + m; mxfp4 (bits 4, no offsets, act_bits 8): w = table[q] * d, table = 2 x e2m1 = "
     "{0, 1, 2, 3, 4, 6, 8, 12, -0, -1, -2, -3, -4, -6, -8, -12} (MXFP4 weights kept exact)"},
};

constexpr OpSchema kSchema{
    kOp,
    "y = epilogue(x W^T + sum over a token's adapters of w * scale * (x A) B), W block-quantized (int4, int8)",
    kInputs,
    sizeof(kInputs) / sizeof(kInputs[0]),
    kAttrs,
    sizeof(kAttrs) / sizeof(kAttrs[0]),
    "lora_layer",
    nullptr,
    0};

const ParsedSchema& parsed() {
  static const ParsedSchema p(kSchema);
  return p;
}

// The table's symbols a wrapper binds or reads, by id (looked up once).
struct Symbols {
  int T, K, N, G, kb, code_bytes, k_chunks, M, slots, r_max, width;
};
const Symbols& symbols() {
  static const Symbols s = [] {
    const ParsedSchema& p = parsed();
    return Symbols{
        p.sym("T"),          p.sym("K"), p.sym("N"),       p.sym("G"),     p.sym("kb"), p.sym("block_size*bits"),
        p.sym("ceil(K/32)"), p.sym("M"), p.sym("n_slots"), p.sym("r_max"), p.sym("N_j")};
  }();
  return s;
}

OrtStatusPtr make_status(OrtErrorCode code, const std::string& msg) {
  return Ort::GetApi().CreateStatus(code, msg.c_str());
}

}  // namespace

const OpSchema& qlinear_schema() {
  return kSchema;
}

bool parse_epilogue(const std::string& s, QLinearEpilogue* e) {
  static const std::pair<const char*, QLinearEpilogue> kNames[] = {{"none", QLinearEpilogue::kNone},
                                                                   {"residual", QLinearEpilogue::kResidual},
                                                                   {"swiglu", QLinearEpilogue::kSwiGLU},
                                                                   {"geglu", QLinearEpilogue::kGeGLU}};
  for (const auto& [name, value] : kNames) {
    if (s == name) {
      *e = value;
      return true;
    }
  }
  return false;
}

std::string parse_weight_format(const char* op, const std::string& s, int64_t bits, bool* mxfp4) {
  std::ostringstream err;
  if (s != "affine" && s != "mxfp4")
    err << op << ": attribute weight_format must be \"affine\" or \"mxfp4\"; got \"" << s << "\"";
  else if (s == "mxfp4" && bits != 4)
    err << op << ": attribute weight_format \"mxfp4\" needs bits = 4 (4-bit table codes); got bits = " << bits;
  *mxfp4 = s == "mxfp4";
  return err.str();
}

QLinearKernel::QLinearKernel(const OrtApi& api, const OrtKernelInfo* info, const OpsIsa& isa) : isa_(&isa) {
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
  const std::string format_error =
      parse_weight_format(kOp, attr_string(&api, info, "weight_format", "affine"), bits_, &mxfp4_);
  std::ostringstream err;
  if (K_ <= 0 || N_ <= 0)
    err << kOp << ": attributes K and N must be > 0; got K = " << K_ << ", N = " << N_;
  else if (bits_ != 4 && bits_ != 8)
    err << kOp << ": attribute bits must be 4 or 8; got " << bits_;
  else if (block_size_ <= 0 || block_size_ % 32 != 0 || block_size_ > kQLinearMaxBlock)
    err << kOp << ": attribute block_size must be a multiple of 32 up to " << kQLinearMaxBlock
        << " (32, 64, 128, 256); got " << block_size_;
  else if (act_bits_ != 8 && act_bits_ != 16)
    err << kOp << ": attribute act_bits must be 8 or 16; got " << act_bits_;
  else if (act_bits_ == 16 && (bits_ != 8 || block_size_ > kQLinearMaxBlock16))
    err << kOp << ": attribute act_bits = 16 needs bits = 8 and block_size <= 128 (int16 x int8 dots summed in int32); "
        << "got bits = " << bits_ << ", block_size = " << block_size_;
  else if (!format_error.empty())
    err << format_error;
  else if (mxfp4_ && act_bits_ != 8)
    err << kOp << ": attribute weight_format \"mxfp4\" needs act_bits = 8; got " << act_bits_;
  else if (!parse_epilogue(epi, &epilogue_))
    err << kOp << ": attribute epilogue must be \"none\", \"residual\", \"swiglu\" or \"geglu\"; got \"" << epi << "\"";
  if (err.str().empty() && is_gated(epilogue_) && N_ % 16 != 0)
    err << kOp << ": epilogue \"" << epi << "\" needs N (gate|up) a multiple of 16; got N = " << N_;
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
    // The table's checks (type, rank, shared dims) of the inputs this call reads; the rest here is what the table
    // cannot say: the attributes' requirements and the index values.
    const Symbols& sym = symbols();
    InputCheck check_in(parsed(), lora_layer_ >= 0);
    check_in.bind(sym.K, K_);
    check_in.bind(sym.N, N_);
    const TensorIn x = input(api, context, n_in, kX), codes = input_of(api, context, n_in, kCodes),
                   scales = input_of(api, context, n_in, kScales);
    check_in.check(kX, x);
    const int64_t T = check_in[sym.T];
    QLinearDims dims{T, K_, N_, block_size_, static_cast<int>(bits_), epilogue_, static_cast<int>(act_bits_)};
    dims.mxfp4 = mxfp4_;
    check_in.bind(sym.G, dims.groups());
    check_in.bind(sym.kb, dims.k_blocks());
    check_in.bind(sym.code_bytes, block_size_ * bits_);
    check_in.bind(sym.k_chunks, (K_ + kLoraChunk - 1) / kLoraChunk);
    check_in.check(kCodes, codes);
    check_in.check(kScales, scales);

    QLinearArgs a{};
    a.x = x.as<float>();
    const TensorIn norm = input_of(api, context, n_in, kNormWeight);
    if (check_in.check(kNormWeight, norm)) {
      if (!(norm_eps_ > 0.f)) fail(kOp, ": attribute norm_eps must be > 0; got ", norm_eps_);
      a.norm_weight = norm.as<float>();
      a.norm_eps = norm_eps_;
    }
    a.codes = codes.as<uint8_t>();
    a.d = scales.as<uint16_t>();
    const TensorIn offsets = input_of(api, context, n_in, kOffsets);
    if (check_in.check(kOffsets, offsets)) a.m = offsets.as<uint16_t>();
    if (mxfp4_ && a.m != nullptr)
      fail(kOp, ": input 'offsets' is not read with weight_format \"mxfp4\" (w = table[q] * d); leave it out");
    const TensorIn residual = input(api, context, n_in, kResidual);
    if (epilogue_ == QLinearEpilogue::kResidual) {
      check_in.check(kResidual, residual, "epilogue \"residual\"");
      a.residual = residual.as<float>();
    } else if (residual.value) {
      fail(kOp, ": input 'residual' is only read with epilogue \"residual\"; got epilogue without it");
    }

    const TensorIn adapter = input(api, context, n_in, kAdapter);
    if (check_in.check(kAdapter, adapter)) {
      // [T]: one slot a token; [T, M]: up to M <= 4 slots a token, mixed with the weights of input
      // 'token_adapter_weight' of the same form (1 without it)
      const int form = adapter.rank == 2 ? 1 : 0;
      const int64_t M = form ? check_in[sym.M] : 1;
      if (M < 1 || M > kQLinearMaxTerms)
        fail(kOp, ": input 'token_adapter' [T, M] needs M in [1, ", kQLinearMaxTerms, "]; got shape ",
             shape_str(adapter.shape()));
      a.adapter_terms = M;
      const TensorIn weight = input(api, context, n_in, kAdapterWeight);
      if (check_in.check(kAdapterWeight, weight, nullptr, form)) a.adapter_weight = weight.as<float>();
      const TensorIn lscale = input(api, context, n_in, kLoraScale);
      check_in.check(kLoraScale, lscale, "input 'token_adapter'");
      const int64_t slots = check_in[sym.slots];
      a.token_adapter = adapter.as<int32_t>();
      a.lora_scale = lscale.as<float>();
      a.n_slots = slots;
      a.packed_a = packed_a_;
      bool any = false;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < M; ++k) {
          const int32_t s = a.token_adapter[t * M + k];
          if (s < -1 || s >= slots) {
            if (form == 0)
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
      if (check_in.check(kDora, dora)) {
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
      const bool stacked = lora_layer_ >= 0;  // [n_layers, ...] stacks (attribute lora_layer picks this node's layer)
      // this layer's [n_slots, ...] of input i (a stack's slice): its element offset (0 unstacked)
      auto at = [&](const TensorIn& in, size_t i) {
        return stacked ? layer_offset(kOp, "lora_layer", kInputs[i].name, in.dims, static_cast<size_t>(in.rank),
                                      lora_layer_)
                       : 0;
      };
      int64_t col = 0;
      for (int j = 0; any && j < kQLinearMaxSegments; ++j) {
        const size_t base = kSeg0 + kSegInputs * j;
        const TensorIn A = input(api, context, n_in, base), sA = input(api, context, n_in, base + 1),
                       B = input(api, context, n_in, base + 2), sB = input(api, context, n_in, base + 3),
                       rank = input(api, context, n_in, base + 4);
        if (!A.value && !sA.value && !B.value && !sB.value && !rank.value) continue;
        if (!A.value || !sA.value || !B.value || !sB.value || !rank.value)
          fail(kOp, ": LoRA segment ", j, " needs all of inputs '", kInputs[base].name, "', '", kInputs[base + 1].name,
               "', '", kInputs[base + 2].name, "', '", kInputs[base + 3].name, "' and '", kInputs[base + 4].name, "'");
        if (K_ % 4 != 0) fail(kOp, ": a LoRA needs K a multiple of 4 (A's k-quads); got K = ", K_);
        check_in.unbind(sym.r_max);  // each segment's own
        check_in.unbind(sym.width);
        check_in.check(base, A);
        const int64_t r_max = check_in[sym.r_max];
        if (r_max % 4 != 0)
          fail(kOp, ": input '", kInputs[base].name, "' needs r_max a multiple of 4 (B's rank quads); got ", r_max);
        check_in.check(base + 1, sA);
        check_in.check(base + 2, B);
        check_in.check(base + 3, sB);
        check_in.check(base + 4, rank);
        const int64_t width = check_in[sym.width];
        const int32_t* rk = rank.as<int32_t>();
        for (int64_t s = 0; s < slots; ++s)
          if (rk[s] < 0 || rk[s] > r_max)
            fail(kOp, ": input '", kInputs[base + 4].name, "'[", s, "] = ", rk[s], " is outside [0, r_max = ", r_max,
                 "]");
        // DoRA rows' scales on this segment, read where a slot is flagged in 'dora' (checked below)
        const TensorIn dscale = any_dora ? input(api, context, n_in, kDoraScale0 + j) : TensorIn{};
        if (check_in.check(kDoraScale0 + j, dscale))
          a.dora_scale[a.n_segments] = dscale.as<float>() + at(dscale, kDoraScale0 + j);
        QLinearLoraSegment& sg = a.seg[a.n_segments++];
        sg = {A.as<int8_t>() + at(A, base),
              sA.as<uint16_t>() + at(sA, base + 1),
              B.as<int8_t>() + at(B, base + 2),
              sB.as<uint16_t>() + at(sB, base + 3),
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
          fail(kOp, ": a token of a slot flagged in input 'dora' needs input '", kInputs[kDoraScale0 + j].name, "'");
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
    qlinear(dims, a, Parallel{ort_parallel_for, context}, *isa_);
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
    *kernel = new QLinearKernel(api, info, *isa);
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, e.what());
  }
}

}  // namespace ortllm
