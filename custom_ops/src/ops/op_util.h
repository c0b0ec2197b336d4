// Helpers for the ORT-facing wrappers: attribute reading without exceptions, shape formatting,
// and the error type that the wrappers turn into an ORT status (C++ exceptions never leave the
// library: every Compute catches and returns Ort::Status).
#pragma once
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ortllm {

// A bad input or attribute; what() is the full user-facing message.
struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

// expected: -1 = any extent. Throws OpError naming the op, the input and both shapes.
inline void expect_shape(const char* op, const char* name, const std::vector<int64_t>& got,
                         const std::vector<int64_t>& expected) {
  bool ok = got.size() == expected.size();
  for (size_t i = 0; ok && i < got.size(); ++i) ok = expected[i] < 0 || got[i] == expected[i];
  if (!ok) {
    std::vector<int64_t> e = expected;
    std::ostringstream o;
    o << op << ": input '" << name << "' has shape " << shape_str(got) << ", expected [";
    for (size_t i = 0; i < e.size(); ++i) o << (i ? ", " : "") << (e[i] < 0 ? std::string("?") : std::to_string(e[i]));
    o << "]";
    throw OpError(o.str());
  }
}

template <typename... Parts>
[[noreturn]] inline void fail(const Parts&... parts) {
  std::ostringstream o;
  (o << ... << parts);
  throw OpError(o.str());
}

// An input as a wrapper reads it through the C API: its value, data, element type and shape (`rank` = -1:
// absent; dims past kMaxRank are not kept, and such a rank is always an error). Reading one costs one
// type-and-shape query and allocates nothing of ours: a B = 1 decode step makes ~150 op calls, and their
// wrappers' heap objects and shape vectors were ~1.8 us of a QLinear call (measured in the engine).
struct TensorIn {
  static constexpr int kMaxRank = 8;
  const OrtValue* value = nullptr;
  const void* data = nullptr;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  int64_t dims[kMaxRank] = {};
  int rank = -1;
  std::vector<int64_t> shape() const {  // the kept dims (a rank past kMaxRank is reported cut at kMaxRank)
    return std::vector<int64_t>(dims, dims + (rank < 0 ? 0 : rank > kMaxRank ? kMaxRank : rank));
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

// An ORT status from the C API as an exception (its message kept), released.
inline void check(const OrtApi& api, OrtStatus* st) {
  if (st == nullptr) return;
  const std::string msg = api.GetErrorMessage(st);
  api.ReleaseStatus(st);
  throw std::runtime_error(msg);
}

inline TensorIn describe(const OrtApi& api, const OrtValue* value) {
  TensorIn in;
  if (value == nullptr) return in;
  in.value = value;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api, api.GetTensorTypeAndShape(value, &info));
  size_t rank = 0;
  OrtStatus* st = api.GetTensorElementType(info, &in.type);
  if (st == nullptr) st = api.GetDimensionsCount(info, &rank);
  if (st == nullptr) {
    in.rank = static_cast<int>(rank);
    st = api.GetDimensions(info, in.dims, rank < static_cast<size_t>(TensorIn::kMaxRank) ? rank : TensorIn::kMaxRank);
  }
  api.ReleaseTensorTypeAndShapeInfo(info);
  check(api, st);
  void* data = nullptr;
  check(api, api.GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  in.data = data;
  return in;
}

// Input i of a call with n_inputs inputs (absent past them or when the node leaves it out).
inline TensorIn input(const OrtApi& api, OrtKernelContext* ctx, size_t n_inputs, size_t i) {
  if (i >= n_inputs) return TensorIn{};
  const OrtValue* value = nullptr;
  check(api, api.KernelContext_GetInput(ctx, i, &value));
  return describe(api, value);
}

// Output i's buffer (null when the node leaves that optional output out).
template <typename T>
T* output(const OrtApi& api, OrtKernelContext* ctx, size_t i, const int64_t* dims, size_t rank) {
  OrtValue* value = nullptr;
  check(api, api.KernelContext_GetOutput(ctx, i, dims, rank, &value));
  if (value == nullptr) return nullptr;
  void* data = nullptr;
  check(api, api.GetTensorMutableData(value, &data));
  return static_cast<T*>(data);
}

// in's shape must be want[0, n) (-1: any extent); else the error names the op, the input and both shapes.
inline void expect(const char* op, const char* name, const TensorIn& in, const int64_t* want, size_t n) {
  bool ok = in.rank == static_cast<int>(n);
  for (size_t i = 0; ok && i < n; ++i) ok = want[i] < 0 || in.dims[i] == want[i];
  if (!ok) expect_shape(op, name, in.shape(), std::vector<int64_t>(want, want + n));  // throws, naming both shapes
}

inline void expect(const char* op, const char* name, const TensorIn& in, std::initializer_list<int64_t> want) {
  expect(op, name, in, want.begin(), want.size());
}

// An input stacked as [n_layers, ...] of which a node reads one layer (contract 7: PagedAttention's caches,
// QLinear's LoRA stacks): the element offset of layer `layer`'s slice, i.e. layer x the product of dims[1:rank].
// A layer outside dims[0] is an OpError naming the op, the attribute that chose it and the input.
inline int64_t layer_offset(const char* op, const char* attr, const char* name, const int64_t* dims, size_t rank,
                            int64_t layer) {
  if (layer >= dims[0])
    fail(op, ": attribute ", attr, " = ", layer, " is outside input '", name, "''s ", dims[0], " layers");
  int64_t slice = 1;
  for (size_t i = 1; i < rank; ++i) slice *= dims[i];
  return layer * slice;
}

inline int64_t attr_int(const OrtApi* api, const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t v = fallback;
  if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, name, &v)) {
    api->ReleaseStatus(st);
    return fallback;
  }
  return v;
}

inline float attr_float(const OrtApi* api, const OrtKernelInfo* info, const char* name, float fallback) {
  float v = fallback;
  if (OrtStatus* st = api->KernelInfoGetAttribute_float(info, name, &v)) {
    api->ReleaseStatus(st);
    return fallback;
  }
  return v;
}

inline std::string attr_string(const OrtApi* api, const OrtKernelInfo* info, const char* name,
                               const std::string& fallback) {
  size_t size = 0;
  if (OrtStatus* st = api->KernelInfoGetAttribute_string(info, name, nullptr, &size)) {
    api->ReleaseStatus(st);
    return fallback;
  }
  std::string v(size, '\0');
  if (OrtStatus* st = api->KernelInfoGetAttribute_string(info, name, v.data(), &size)) {
    api->ReleaseStatus(st);
    return fallback;
  }
  v.resize(size > 0 ? size - 1 : 0);  // size includes the terminating NUL
  return v;
}

// The session's intra-op pool, as the kernels' Parallel hook.
inline void ort_parallel_for(void* ctx, void (*fn)(void*, size_t), size_t total, void* usr) {
  Ort::KernelContext kc(static_cast<OrtKernelContext*>(ctx));
  kc.ParallelFor(fn, total, 0, usr);
}

}  // namespace ortllm
