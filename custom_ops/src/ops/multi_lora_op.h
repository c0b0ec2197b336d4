// ORT wrapper of the MultiLoRA kernel, on Ort::CustomOpBase with status returns (inputs read by index, so an
// optional input may be left out ("") before a later one). Input/output order and attributes:
//   inputs : 0 x [T, in] f32, 1 base_y [T, out] f32, 2 A [n_slots, in, r_max] f16,
//            3 B [n_slots, r_max, out] f16, 4 scale [n_slots] f32, 5 rank [n_slots] i32,
//            6 token_adapter [T] i32 (-1 = no adapter), or [T, M] i32 (M <= 4, ops ABI 14): up to M slots a
//              token, mixed (a row's -1s after its slots; a DoRA slot only alone, weight 1)
//            7 offsets [ceil(in / block_size), out] f16, optional: the offset term of an asymmetric
//              quantized base projection, y += blocksum(x) @ offsets (kernels/block_offsets.h)
//            8 dora [n_slots] i32, optional (ops ABI 12): 1 where the slot holds a DoRA adapter, else 0
//            9 dora_scale [n_slots, out] f32 ([n_layers, n_slots, out] with attribute lora_layer), with dora:
//              a DoRA row's per-output scale, y = g * (base_y + offsets + lora) (kernels/multi_lora.h)
//            10 token_adapter_weight [T, M] (or [T]) f32, optional (ops ABI 14): each term's weight (1 without it)
//   outputs: 0 y [T, out] f32 (may alias base_y: then nothing is copied)
//   attributes: block_size (int, required with offsets: the quantization block along in)
//               packed_a (int, default 0): 1 = slot s of A holds a row-major [in, rank[s]] matrix in its
//               first in * rank[s] elements (what the engine binds: no padding columns streamed)
//               lora_layer (int, default -1): dora_scale is a stack of every layer and the node reads this one
#pragma once
#include "op_util.h"

namespace ortllm {

struct MultiLoraKernel {
  MultiLoraKernel(const OrtApi& api, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  int64_t block_size_ = 0;
  bool packed_a_ = false;
  int64_t lora_layer_ = -1;
};

struct MultiLoraOp : Ort::CustomOpBase<MultiLoraOp, MultiLoraKernel, true> {
  static constexpr size_t kInputs = 11;

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "MultiLoRA"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return kInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const;
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i <= 6 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                  : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace ortllm
