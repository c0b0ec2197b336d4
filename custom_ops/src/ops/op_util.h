// Helpers for the ORT-facing wrappers: attribute reading without exceptions, shape formatting,
// and the error type that the wrappers turn into an ORT status (C++ exceptions never leave the
// library: every Compute catches and returns Ort::Status).
#pragma once
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <cstdint>
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
