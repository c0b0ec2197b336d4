// ORT wrapper of the QLinear kernel (kernels/qlinear.h), on Ort::CustomOpBase with status returns: its 28 inputs,
// most optional, are read by index rather than through a Lite signature. Inputs and attributes: the table
// qlinear_schema() (qlinear_op.cc; custom_ops/README.md lists it).
//   outputs: 0 y [T, N] f32, or [T, N / 2] with epilogue "swiglu" (SiLU(y[:, :N/2]) * y[:, N/2:]) or "geglu"
//            (GELU-tanh(y[:, :N/2]) * y[:, N/2:]);
//            with attribute split = [N_0, N_1(, N_2)] (epilogue "none"): y_j [T, N_j] = columns N_0 + .. of y,
//            outputs 1 and 2 optional (q, k, v straight out of the fused q|k|v projection, no Split node)
//            3 argmax [T] i64 optional (epilogue "none", no split): each row's first maximum of y (the LM head's
//            greedy token; outputs 1 and 2 are "" then)
#pragma once
#include <string>
#include <vector>

#include "../kernels/isa.h"
#include "../kernels/qlinear.h"
#include "op_schema.h"
#include "op_util.h"

namespace ortllm {

const OpSchema& qlinear_schema();  // QLinear's inputs and attributes
// The epilogue an attribute value names ("none", "residual", "swiglu", "geglu"); false for any other.
bool parse_epilogue(const std::string& s, QLinearEpilogue* e);
// The weight_format attribute (QLinear and MoE, ops ABI 18): "affine" (w = d * (q - zp) + m) or "mxfp4" (w =
// kMxfp4Table[q] * d, bits 4, no offsets); "" when s is one of them (*mxfp4 set), else the attribute's error.
std::string parse_weight_format(const char* op, const std::string& s, int64_t bits, bool* mxfp4);

struct QLinearKernel {
  QLinearKernel(const OrtApi& api, const OrtKernelInfo* info, const OpsIsa& isa);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  int64_t K_ = 0, N_ = 0, bits_ = 0, block_size_ = 0, act_bits_ = 8;
  bool mxfp4_ = false;  // weight_format "mxfp4"
  bool packed_a_ = false;
  float norm_eps_ = 1e-5f;
  int64_t lora_layer_ = -1;  // >= 0: the LoRA stacks are [n_layers, ...] and this node reads that layer
  std::vector<int64_t> split_;
  QLinearEpilogue epilogue_ = QLinearEpilogue::kNone;
  std::string init_error_;  // attribute problems, reported by every Compute (no throwing)
  // The initializers read once at creation (absent, rank -1, when the input is not one): codes, scales, offsets,
  // norm_weight, by constant_slot.
  TensorIn constant_[4];
  static size_t constant_slot(size_t input);
  TensorIn input_of(const OrtApi& api, OrtKernelContext* context, size_t n_inputs, size_t i) const;
  const OpsIsa* isa_;
};

constexpr int kQLinearSegInputs = 5;  // per LoRA segment j: A_j, A_scale_j, B_j, B_scale_j, rank_j

struct QLinearOp : Ort::CustomOpBase<QLinearOp, QLinearKernel, true> {
  const OpsIsa* isa = nullptr;  // the session's kernel path (register.cc sets it per registration)
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "QLinear"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return qlinear_schema().n_inputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const { return qlinear_schema().inputs[i].type; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return qlinear_schema().characteristic(i);
  }
  size_t GetOutputTypeCount() const { return kQLinearMaxOutputs + 1; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i == 0 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                  : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
  }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    return i == kQLinearArgmaxOutput ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
};

}  // namespace ortllm
