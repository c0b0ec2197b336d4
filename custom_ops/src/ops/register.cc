// Library entry points: RegisterCustomOps (domain "ortllm": PagedAttention for float32, float16 and uint8
// caches, MultiLoRA, QLinear, MoE), OrtllmOpsAbiVersion, OrtllmOpsIsa and OrtllmOpsSchema (the ops' tables as JSON).
// Built with ORT_API_MANUAL_INIT and not linked to libonnxruntime: the OrtApi comes from the runtime that loads us.
// Inputs that an output may reuse are declared with GetMayInplace, so ORT can hand the kernel the input's buffer as
// output (the kernel then copies nothing). ORT's planner only does so when it knows both shapes are the same, so
// MultiLoRA also infers its output shape (y has base_y's, symbolic dims included).
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../kernels/isa.h"
#include "../kernels/stream_prefetch.h"
#include "../kernels/vec.h"
#include "moe_op.h"
#include "multi_lora_op.h"
#include "paged_attention_op.h"
#include "qlinear_op.h"

// The ops ABI version is one constant, OPS_ABI_VERSION in runtime/ops_library.py: CMakeLists.txt reads it from there
// and passes it in (bump it on any change of an op's inputs, outputs or attributes).
#ifndef ORTLLM_OPS_ABI_VERSION
#error "ORTLLM_OPS_ABI_VERSION comes from runtime/ops_library.py (custom_ops/CMakeLists.txt passes it)"
#endif

namespace {

// MayInplace pairs, read by ORT through OrtCustomOp::GetMayInplace (API >= 18).

size_t copy_pairs(const std::vector<std::pair<int, int>>& pairs, int** in, int** out) {
  *in = new int[pairs.size()];
  *out = new int[pairs.size()];
  for (size_t i = 0; i < pairs.size(); ++i) {
    (*in)[i] = pairs[i].first;
    (*out)[i] = pairs[i].second;
  }
  return pairs.size();
}

size_t ORT_API_CALL paged_attention_inplace(int** in, int** out) {
  return copy_pairs({{9, 1}, {10, 2}, {11, 3}, {12, 4}}, in, out);
}
size_t ORT_API_CALL multi_lora_inplace(int** in, int** out) {
  return copy_pairs({{1, 0}}, in, out);
}
size_t ORT_API_CALL qlinear_inplace(int** in, int** out) {
  return copy_pairs({{4, 0}}, in, out);
}
void ORT_API_CALL release_inplace(int* in, int* out) {
  delete[] in;
  delete[] out;
}

// Output `out` gets input `in`'s shape and type. Uses the C API only and never throws: where the
// input's shape is unknown, nothing is inferred.
OrtStatusPtr same_shape(OrtShapeInferContext* ctx, size_t in, size_t out) {
  const OrtApi& api = Ort::GetApi();
  OrtTensorTypeAndShapeInfo* info = nullptr;  // owned by ctx (not released here)
  if (OrtStatus* st = api.ShapeInferContext_GetInputTypeShape(ctx, in, &info)) {
    api.ReleaseStatus(st);
    return nullptr;
  }
  return api.ShapeInferContext_SetOutputTypeShape(ctx, out, info);
}
// MultiLoRA: y [T, out] is base_y's shape (so y can take base_y's buffer; else the kernel copies).
OrtStatusPtr ORT_API_CALL multi_lora_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  return same_shape(ctx, 1, 0);
}
// PagedAttention: attn [T, H*D] is q's shape, so the projection after it (o_proj, then its MultiLoRA)
// has a known shape too. The cache outputs keep their declared (graph output) shapes.
OrtStatusPtr ORT_API_CALL paged_attention_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  return same_shape(ctx, 0, 0);
}
// MoE: y [T, H] is x's shape.
OrtStatusPtr ORT_API_CALL moe_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  return same_shape(ctx, 0, 0);
}

// QLinear: y is [T, N] (x's T, attribute N), [T, N / 2] with epilogue "swiglu" or "geglu", and residual's
// own shape with epilogue "residual" (so y can take the residual's buffer).
OrtStatusPtr ORT_API_CALL qlinear_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  const OrtApi& api = Ort::GetApi();
  auto attr_int = [&](const char* name, int64_t fallback) {
    const OrtOpAttr* attr = nullptr;
    int64_t v = fallback;
    size_t size = 0;
    if (OrtStatus* st = api.ShapeInferContext_GetAttribute(ctx, name, &attr)) {
      api.ReleaseStatus(st);
      return fallback;
    }
    if (OrtStatus* st = api.ReadOpAttr(attr, ORT_OP_ATTR_INT, &v, sizeof(v), &size)) {
      api.ReleaseStatus(st);
      return fallback;
    }
    return v;
  };
  char epi[16] = {0};
  {
    const OrtOpAttr* attr = nullptr;
    size_t size = 0;
    if (OrtStatus* st = api.ShapeInferContext_GetAttribute(ctx, "epilogue", &attr)) {
      api.ReleaseStatus(st);
    } else if (OrtStatus* st2 = api.ReadOpAttr(attr, ORT_OP_ATTR_STRING, epi, sizeof(epi) - 1, &size)) {
      api.ReleaseStatus(st2);
      epi[0] = 0;
    }
  }
  if (std::string(epi) == "residual") return same_shape(ctx, 4, 0);
  OrtTensorTypeAndShapeInfo* x_info = nullptr;  // owned by ctx
  if (OrtStatus* st = api.ShapeInferContext_GetInputTypeShape(ctx, 0, &x_info)) {
    api.ReleaseStatus(st);
    return nullptr;
  }
  size_t rank = 0;
  if (OrtStatus* st = api.GetDimensionsCount(x_info, &rank)) {
    api.ReleaseStatus(st);
    return nullptr;
  }
  if (rank != 2) return nullptr;
  int64_t dims[2];
  const char* syms[2] = {nullptr, nullptr};
  if (OrtStatus* st = api.GetDimensions(x_info, dims, 2)) {
    api.ReleaseStatus(st);
    return nullptr;
  }
  if (OrtStatus* st = api.GetSymbolicDimensions(x_info, syms, 2)) {
    api.ReleaseStatus(st);
    return nullptr;
  }
  const int64_t n = attr_int("N", -1);
  // widths of the outputs: attribute split (epilogue "none"), else one output of N (N / 2 gated)
  std::vector<int64_t> widths(ortllm::kQLinearMaxOutputs, 0);
  {
    const OrtOpAttr* attr = nullptr;
    size_t size = 0;
    if (OrtStatus* st = api.ShapeInferContext_GetAttribute(ctx, "split", &attr)) {
      api.ReleaseStatus(st);
      widths.clear();
    } else if (OrtStatus* st2 =
                   api.ReadOpAttr(attr, ORT_OP_ATTR_INTS, widths.data(), widths.size() * sizeof(int64_t), &size)) {
      api.ReleaseStatus(st2);
      widths.clear();
    } else {
      widths.resize(size / sizeof(int64_t));
    }
  }
  ortllm::QLinearEpilogue e = ortllm::QLinearEpilogue::kNone;
  const bool gated = ortllm::parse_epilogue(epi, &e) && ortllm::is_gated(e);
  if (widths.empty()) widths = {n > 0 && gated ? n / 2 : n};
  const char* out_syms[2] = {syms[0] ? syms[0] : "", ""};
  for (size_t j = 0; j < widths.size(); ++j) {
    dims[1] = widths[j];
    OrtTensorTypeAndShapeInfo* out = nullptr;
    if (OrtStatus* st = api.CreateTensorTypeAndShapeInfo(&out)) return st;
    OrtStatus* st = api.SetTensorElementType(out, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
    if (!st) st = api.SetDimensions(out, dims, 2);
    if (!st) st = api.SetSymbolicDimensions(out, out_syms, 2);
    if (!st) st = api.ShapeInferContext_SetOutputTypeShape(ctx, j, out);
    api.ReleaseTensorTypeAndShapeInfo(out);
    if (st) {  // e.g. a node wired with fewer outputs than split names: the kernel reports that
      api.ReleaseStatus(st);
      break;
    }
  }
  {  // the optional argmax [T] int64 (nothing to do when the node leaves it out)
    OrtTensorTypeAndShapeInfo* out = nullptr;
    if (OrtStatus* st = api.CreateTensorTypeAndShapeInfo(&out)) return st;
    OrtStatus* st = api.SetTensorElementType(out, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
    if (!st) st = api.SetDimensions(out, dims, 1);
    if (!st) st = api.SetSymbolicDimensions(out, out_syms, 1);
    if (!st) st = api.ShapeInferContext_SetOutputTypeShape(ctx, ortllm::kQLinearArgmaxOutput, out);
    api.ReleaseTensorTypeAndShapeInfo(out);
    if (st) api.ReleaseStatus(st);
  }
  return nullptr;
}

struct Ops {
  ortllm::MultiLoraOp lora;
  ortllm::PagedAttentionOp<float> pa_f32;
  ortllm::PagedAttentionOp<uint16_t> pa_f16;
  ortllm::PagedAttentionOp<uint8_t> pa_u8;
  ortllm::QLinearOp qlinear;
  ortllm::MoeOp moe;
};

// The ops of one kernel path: one set per row of the ISA registry, made at the first session that names it and kept
// as long as the library (sessions hold pointers to them).
Ops& ops_for(const ortllm::OpsIsa& isa) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<Ops>> made;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& o : made)
    if (o->qlinear.isa == &isa) return *o;
  made.push_back(std::make_unique<Ops>([&] {
    Ops x;
    x.pa_f32.isa = x.pa_f16.isa = x.pa_u8.isa = x.lora.isa = x.qlinear.isa = x.moe.isa = &isa;
    for (OrtCustomOp* op : {static_cast<OrtCustomOp*>(&x.pa_f32), static_cast<OrtCustomOp*>(&x.pa_f16),
                            static_cast<OrtCustomOp*>(&x.pa_u8)}) {
      op->GetMayInplace = paged_attention_inplace;
      op->ReleaseMayInplace = release_inplace;
      op->InferOutputShapeFn = paged_attention_shape;
    }
    x.lora.GetMayInplace = multi_lora_inplace;
    x.lora.ReleaseMayInplace = release_inplace;
    x.lora.InferOutputShapeFn = multi_lora_shape;
    x.qlinear.GetMayInplace = qlinear_inplace;
    x.qlinear.ReleaseMayInplace = release_inplace;
    x.qlinear.InferOutputShapeFn = qlinear_shape;
    x.moe.InferOutputShapeFn = moe_shape;
    return x;
  }()));
  return *made.back();
}

// The session's kernel path: its config entry ortllm.ops_isa (isa.h kSessionIsaKey) if set, else the default.
// nullptr (and *error set) when the entry names a path this build or CPU lacks.
const ortllm::OpsIsa* session_isa(const OrtApi* api, const OrtSessionOptions* options, std::string* error) {
  int has = 0;
  if (OrtStatus* st = api->HasSessionConfigEntry(options, ortllm::kSessionIsaKey, &has)) {
    api->ReleaseStatus(st);
    has = 0;
  }
  if (!has) return &ortllm::default_isa();
  size_t size = 0;
  std::string value;
  if (OrtStatus* st = api->GetSessionConfigEntry(options, ortllm::kSessionIsaKey, nullptr, &size)) {
    api->ReleaseStatus(st);
  }
  value.resize(size);
  if (size > 0) {
    if (OrtStatus* st = api->GetSessionConfigEntry(options, ortllm::kSessionIsaKey, value.data(), &size)) {
      api->ReleaseStatus(st);
    }
    value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  }
  if (value.empty()) return &ortllm::default_isa();
  if (const ortllm::OpsIsa* isa = ortllm::find_isa(value)) return isa;
  *error = std::string(ortllm::kSessionIsaKey) + "='" + value +
           "': not a kernel path of this CPU and build; choose one of " + ortllm::supported_isa_names();
  return nullptr;
}

void keep_domain(Ort::CustomOpDomain&& domain) {
  static std::vector<Ort::CustomOpDomain> domains;  // must outlive every session using them
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  domains.push_back(std::move(domain));
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int OrtllmOpsAbiVersion() {
  return ORTLLM_OPS_ABI_VERSION;
}

// The kernel path a session takes by default: the best this CPU runs, or what ORTLLM_OPS_ISA names (isa.h
// default_isa): "scalar", "avx2", "avx512vnni" (AVX2 kernels, with QLinear's and attention's integer dots on
// AVX-512 VNNI), or "amx" (VNNI's, with QLinear's two-group dots of 8 tokens or more on the AMX tile unit).
__attribute__((visibility("default"))) const char* OrtllmOpsIsa() {
  return ortllm::default_isa().name;
}

// Every kernel path this build and CPU run, best first, comma-separated ("avx2, scalar"): the values a session's
// ortllm.ops_isa entry may take.
__attribute__((visibility("default"))) const char* OrtllmOpsIsas() {
  static const std::string names = ortllm::supported_isa_names();
  return names.c_str();
}

// The hint the decode kernels prefetch their once-read streams with (kernels/stream_prefetch.h): "t0" on Intel,
// "nta" elsewhere, or what ORTLLM_OPS_PREFETCH=t0|nta forces.
__attribute__((visibility("default"))) const char* OrtllmOpsPrefetch() {
  return ortllm::stream_prefetch_t0() ? "t0" : "nta";
}

// Every op's inputs and attributes as JSON (op_schema.h), read by runtime/ops_library.py. Built once; the string
// lives as long as the library.
__attribute__((visibility("default"))) const char* OrtllmOpsSchema() {
  static const std::string json = [] {
    const ortllm::OpSchema* schemas[] = {&ortllm::qlinear_schema(), &ortllm::paged_attention_schema(),
                                         &ortllm::multi_lora_schema(), &ortllm::moe_schema()};
    return ortllm::schemas_json(schemas, sizeof(schemas) / sizeof(schemas[0]), ORTLLM_OPS_ABI_VERSION);
  }();
  return json.c_str();
}

__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                 const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // Older runtime: use its oldest API only to report the problem.
    const OrtApi* old = api_base->GetApi(1);
    return old->CreateStatus(ORT_FAIL, "libortllm_ops.so needs onnxruntime >= 1.21 (ORT API 21)");
  }
  Ort::InitApi(api);
  try {
    std::string error;
    const ortllm::OpsIsa* isa = session_isa(api, options, &error);
    if (isa == nullptr) return api->CreateStatus(ORT_INVALID_ARGUMENT, error.c_str());
    Ort::CustomOpDomain domain{"ortllm"};
    Ops& o = ops_for(*isa);
    domain.Add(&o.pa_f32);
    domain.Add(&o.pa_f16);
    domain.Add(&o.pa_u8);
    domain.Add(&o.lora);
    domain.Add(&o.qlinear);
    domain.Add(&o.moe);
    Ort::UnownedSessionOptions session_options(options);
    session_options.Add(domain);
    keep_domain(std::move(domain));
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}

}  // extern "C"
