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

constexpr auto F32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, F16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
               I32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
constexpr InputSpec kInputs[] = {
    {"x", F32, "T, in", false, "the projection's input"},
    {"base_y", F32, "T, out", false, "the base projection's output (y may take its buffer)"},
    {"A", F16, "n_slots, in, r_max", false, "each slot's A (packed_a: a row-major [in, rank] at its start)"},
    {"B", F16, "n_slots, r_max, out", false, "each slot's B"},
    {"scale", F32, "n_slots", false, "each slot's scale (alpha / r)"},
    {"rank", I32, "n_slots", false, "each slot's rank in [0, r_max]; 0: the slot adds nothing"},
    {"token_adapter", I32, "T | T, M", false, "-1 or a slot a token; [T, M] (M <= 4): a mix, a row's -1s last"},
    {"offsets", F16, "ceil(in/block_size), out", true, "an asymmetric quantized base's offset term: blocksum(x) @ it"},
    {"dora", I32, "n_slots", true, "1 where the slot holds a DoRA adapter, else 0"},
    {"dora_scale", F32, "[n_layers,] n_slots, out", true, "with dora: a DoRA row's per-column scale"},
    {"token_adapter_weight", F32, "T | T, M", true, "each term's weight in a token's mix (1 without it)"},
};
static_assert(same_name(kInputs[kAdapter].name, "token_adapter") &&
                  same_name(kInputs[kAdapterWeight].name, "token_adapter_weight") &&
                  sizeof(kInputs) / sizeof(kInputs[0]) == kAdapterWeight + 1,
              "the enum Input names the table's positions");

constexpr AttrSpec kAttrs[] = {
    {"block_size", "int", "0", "the quantization block along in; required with offsets"},
    {"packed_a", "int", "0",
     "1: slot s of A holds a row-major [in, rank[s]] matrix in its first in * rank[s] elements"},
    {"lora_layer", "int", "-1", "with it, dora_scale holds every layer and the node reads this one"},
};

constexpr OpSchema kSchema{
    kOp,
    "y = base_y + sum over a token's adapters of w * scale * (x A) B (+ offsets; DoRA rows scaled)",
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

// The table's symbols the wrapper binds or reads, by id (looked up once).
struct Symbols {
  int T, in, out, M, slots, r_max, in_blocks;
};
const Symbols& symbols() {
  static const Symbols s = [] {
    const ParsedSchema& p = parsed();
    return Symbols{p.sym("T"),
                   p.sym("in"),
                   p.sym("out"),
                   p.sym("M"),
                   p.sym("n_slots"),
                   p.sym("r_max"),
                   p.sym("ceil(in/block_size)")};
  }();
  return s;
}

}  // namespace

MultiLoraKernel::MultiLoraKernel(const OrtApi& api, const OrtKernelInfo* info, const OpsIsa& isa)
    : block_size_(attr_int(&api, info, "block_size", 0)),
      packed_a_(attr_int(&api, info, "packed_a", 0) != 0),
      lora_layer_(attr_int(&api, info, "lora_layer", -1)),
      isa_(&isa) {}

OrtStatusPtr MultiLoraKernel::ComputeV2(OrtKernelContext* ctx) {
  const OrtApi& api = Ort::GetApi();
  try {
    size_t n_in = 0;
    check(api, api.KernelContext_GetInputCount(ctx, &n_in));
    const TensorIn x = input(api, ctx, n_in, kX), base_y = input(api, ctx, n_in, kBaseY), A = input(api, ctx, n_in, kA),
                   B = input(api, ctx, n_in, kB), scale = input(api, ctx, n_in, kScale),
                   rank = input(api, ctx, n_in, kRank), token_adapter = input(api, ctx, n_in, kAdapter);
    // The table's checks (type, rank, shared dims); the rest here is what it cannot say.
    const Symbols& sym = symbols();
    InputCheck check_in(parsed(), lora_layer_ >= 0);
    const TensorIn* required[] = {&x, &base_y, &A, &B, &scale, &rank, &token_adapter};  // inputs kX .. kAdapter
    for (size_t i = kX; i <= kAdapter; ++i) check_in.check(i, *required[i]);
    const int64_t T = check_in[sym.T], in = check_in[sym.in], out = check_in[sym.out], n_slots = check_in[sym.slots],
                  r_max = check_in[sym.r_max];
    // [T], or [T, M] (ops ABI 14): up to M <= 4 slots a token, mixed with input 'token_adapter_weight' (1 without)
    const int form = token_adapter.rank == 2 ? 1 : 0;
    const int64_t M = form ? check_in[sym.M] : 1;
    if (M < 1 || M > kMaxTerms)
      fail(kOp, ": input 'token_adapter' [T, M] needs M in [1, ", kMaxTerms, "]; got shape ",
           shape_str(token_adapter.shape()));
    const TensorIn weight = input(api, ctx, n_in, kAdapterWeight);
    const float* w = check_in.check(kAdapterWeight, weight, nullptr, form) ? weight.as<float>() : nullptr;
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
      if (block_size_ <= 0)
        fail(kOp, ": input 'offsets' needs attribute block_size > 0; got block_size = ", block_size_);
      check_in.bind(sym.in_blocks, (in + block_size_ - 1) / block_size_);
      check_in.check(kOffsets, offsets);
      off = offsets.as<uint16_t>();  // fp16 bits
    }

    // DoRA: the scales are read only when a token of this call has a flagged slot
    const TensorIn dora = input(api, ctx, n_in, kDora);
    const int32_t* dflag = nullptr;
    const float* g = nullptr;
    if (check_in.check(kDora, dora)) {
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
        check_in.check(kDoraScale, gs, "a token of a slot flagged in input 'dora'");
        const int64_t at = lora_layer_ >= 0 ? layer_offset(kOp, "lora_layer", "dora_scale", gs.dims,
                                                           static_cast<size_t>(gs.rank), lora_layer_)
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
    if (off != nullptr) add_block_offsets({T, in, out, block_size_}, x.as<float>(), off, yp, par, *isa_);
    MultiLoraDims dims{T, in, out, n_slots, r_max, packed_a_};
    MultiLoraArgs args{x.as<float>(), A.as<uint16_t>(), B.as<uint16_t>(), scale.as<float>(), rk, ta, yp, M, w};
    multi_lora(dims, args, par, *isa_);
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
    *kernel = new MultiLoraKernel(api, info, *isa);
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, e.what());
  }
}

const OpSchema& multi_lora_schema() {
  return kSchema;
}

}  // namespace ortllm
