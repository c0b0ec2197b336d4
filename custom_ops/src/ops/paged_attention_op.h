// ORT wrapper of the PagedAttention kernel, registered three times under the same name: CacheT = float
// (kv_dtype "float32"), uint16_t (ONNX float16 tensors: kv_dtype "float16", ops ABI 11) and uint8_t (kv_dtype
// "int8" / "fp8_e4m3" / "int4").
//   inputs and attributes: the table paged_attention_schema() (paged_attention_op.cc; custom_ops/README.md lists it)
//   outputs: 0 attn [T, H*D] f32, 1 key_cache_out, 2 value_cache_out (same shape/type as inputs),
//            3 key_scales_out, 4 value_scales_out (optional; required for quantized caches)
//   Cache outputs alias cache inputs when bound to the same buffer (nothing copied then).
// On Ort::CustomOpBase with status returns, inputs read by index: a B = 1 decode call does a few
// microseconds of attention, and the Lite API's per-call wrapping of 13 inputs and 5 outputs (a heap
// object and a shape vector each) was a visible share of it. The rope tables (initializers in the engine
// graph) are read once, when the kernel is created.
#pragma once
#include <string>
#include <type_traits>
#include <vector>

#include "../kernels/isa.h"
#include "../kernels/quant.h"
#include "op_schema.h"
#include "op_util.h"

namespace ortllm {

const OpSchema& paged_attention_schema();  // PagedAttention's inputs and attributes (one table, three variants)

template <typename CacheT>
struct PagedAttentionKernel {
  PagedAttentionKernel(const OrtApi& api, const OrtKernelInfo* info, const OpsIsa& isa);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  const OrtApi& api_;
  int64_t num_heads_, kv_heads_, head_size_, block_size_;
  KvDtype kv_dtype_ = KvDtype::kFloat32;
  bool rotate_ = false, interleaved_ = false;
  float scale_ = 0.f;
  int64_t window_ = 0;      // sliding window (keys a query sees, its own included); 0: none
  int64_t layer_ = -1;      // >= 0: the cache inputs hold every layer ([n_layers, ...]); this node reads this one
  std::string init_error_;  // attribute problems, reported by every Compute (no throwing)
  TensorIn cos_, sin_;      // the rope tables when they are initializers (read once), else absent
  TensorIn sinks_;          // the attention sinks, likewise
  const OpsIsa* isa_;
};

template <typename CacheT>
struct PagedAttentionOp : Ort::CustomOpBase<PagedAttentionOp<CacheT>, PagedAttentionKernel<CacheT>, true> {
  static constexpr size_t kInputs = 14, kOutputs = 5;
  static constexpr ONNXTensorElementDataType kCacheType =
      std::is_same<CacheT, float>::value      ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
      : std::is_same<CacheT, uint16_t>::value ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
                                              : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;

  const OpsIsa* isa = nullptr;  // the session's kernel path (register.cc sets it per registration)
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "PagedAttention"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return paged_attention_schema().n_inputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const {  // the caches' (UNDEFINED in the table): this variant's
    const ONNXTensorElementDataType type = paged_attention_schema().inputs[i].type;
    return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED ? kCacheType : type;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return paged_attention_schema().characteristic(i);
  }
  size_t GetOutputTypeCount() const { return kOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : i < 3 ? kCacheType : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i < 3 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                 : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
  }
};

}  // namespace ortllm
