// ORT wrapper of the MultiLoRA kernel, on Ort::CustomOpBase with status returns (inputs read by index, so an
// optional input may be left out ("") before a later one). Input/output order and attributes:
//   inputs and attributes: the table multi_lora_schema() (multi_lora_op.cc; custom_ops/README.md lists it)
//   outputs: 0 y [T, out] f32 (may alias base_y: then nothing is copied)
#pragma once
#include "../kernels/isa.h"
#include "op_schema.h"
#include "op_util.h"

namespace ortllm {

const OpSchema& multi_lora_schema();  // MultiLoRA's inputs and attributes

struct MultiLoraKernel {
  MultiLoraKernel(const OrtApi& api, const OrtKernelInfo* info, const OpsIsa& isa);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  int64_t block_size_ = 0;
  bool packed_a_ = false;
  int64_t lora_layer_ = -1;
  const OpsIsa* isa_;
};

struct MultiLoraOp : Ort::CustomOpBase<MultiLoraOp, MultiLoraKernel, true> {
  const OpsIsa* isa = nullptr;  // the session's kernel path (register.cc sets it per registration)
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "MultiLoRA"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return multi_lora_schema().n_inputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const { return multi_lora_schema().inputs[i].type; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return multi_lora_schema().characteristic(i);
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace ortllm
