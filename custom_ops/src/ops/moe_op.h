// ORT wrapper of the MoE kernel (kernels/moe.h), on Ort::CustomOpBase with status returns (inputs read by index, the
// optional offsets may be left out ""). Inputs and attributes: the table moe_schema() (moe_op.cc).
//   outputs: 0 y [T, H] f32: sum over a token's k experts of weight * (down(act(gate_up(x) + bias)) + bias)
#pragma once
#include "../kernels/isa.h"
#include "../kernels/moe.h"
#include "op_schema.h"
#include "op_util.h"

namespace ortllm {

const OpSchema& moe_schema();  // MoE's inputs and attributes

struct MoeKernel {
  MoeKernel(const OrtApi& api, const OrtKernelInfo* info, const OpsIsa& isa);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  int64_t H_ = 0, I_ = 0, E_ = 0, top_k_ = 0, bits_ = 0, block_size_ = 0;
  bool mxfp4_ = false;  // weight_format "mxfp4"
  MoeActivation activation_ = MoeActivation::kSwiGLU;
  float alpha_ = 1.702f, limit_ = 7.f;
  std::string init_error_;  // attribute problems, reported by every Compute (no throwing)
  // The experts' weights are initializers: read once at creation (absent, rank -1, when an input is not one), by
  // their input index - kGateUpCodes.
  TensorIn constant_[6];
  TensorIn weight_input(const OrtApi& api, OrtKernelContext* context, size_t n_inputs, size_t i) const;
  const OpsIsa* isa_;
};

struct MoeOp : Ort::CustomOpBase<MoeOp, MoeKernel, true> {
  const OpsIsa* isa = nullptr;  // the session's kernel path (register.cc sets it per registration)
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "MoE"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return moe_schema().n_inputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const { return moe_schema().inputs[i].type; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const { return moe_schema().characteristic(i); }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace ortllm
