// ORT wrapper of the QLinear kernel (kernels/qlinear.h), on Ort::CustomOpBase with status returns
// (its 28 inputs, most optional, are read by index rather than through a Lite signature).
//   inputs : 0 x [T, K] f32
//            1 codes [G, kb, bs * bits] u8  (G = ceil(N / 8), kb = ceil(K / bs); packed layout)
//            2 scales [G, kb, 8] f16        (d per row and block)
//            3 offsets [G, kb, 8] f16       optional: m per row and block (w = d * (q - zp) + m)
//            4 residual [T, N] f32          required with epilogue "residual" (y may take its buffer)
//            5 token_adapter [T] i32        optional (-1 or a slot); with it, 6 and one or more segments;
//              or [T, M] i32 (M <= 4, ops ABI 14): up to M slots a token, mixed (a row's -1s after its slots)
//            6 lora_scale [n_slots] f32
//            7 + 5j .. 11 + 5j (j < 3): A_j [n_slots, K, r_max_j] i8, A_scale_j [n_slots, ceil(K / 32), r_max_j]
//                                      f16, B_j [n_slots, r_max_j, N_j] i8, B_scale_j [n_slots, N_j] f16,
//                                      rank_j [n_slots] i32 (the first four [n_layers, ...] with lora_layer);
//                                      segment j covers output columns [N_0 + .. + N_{j-1}, + N_j); present
//                                      segments cover N exactly
//            22 norm_weight [K] f32     optional: y is computed from RMSNorm(x) * norm_weight (eps: norm_eps)
//            23 dora [n_slots] i32      optional (ops ABI 12): 1 where the slot holds a DoRA adapter, else 0
//            24 + j dora_scale_j [n_slots, N_j] f32 ([n_layers, ...] with lora_layer), with dora, one per LoRA
//                                      segment: a DoRA row's per-output scale (y = epilogue(g * (x W^T + lora)))
//            27 token_adapter_weight [T, M] (or [T]) f32  optional (ops ABI 14): each term's weight (1 without it):
//                                      a token's LoRA is sum_k w_k * lora_scale[slot_k] * (x A) B, in k order
//   outputs: 0 y [T, N] f32, or [T, N / 2] with epilogue "swiglu" (SiLU(y[:, :N/2]) * y[:, N/2:]);
//            with attribute split = [N_0, N_1(, N_2)] (epilogue "none"): y_j [T, N_j] = columns N_0 + .. of y,
//            outputs 1 and 2 optional (q, k, v straight out of the fused q|k|v projection, no Split node)
//            3 argmax [T] i64 optional (epilogue "none", no split): each row's first maximum of y (the LM head's
//            greedy token; outputs 1 and 2 are "" then)
//   attributes: K, N, bits (4 | 8), block_size (a multiple of 32) -- int, required;
//               epilogue (string "none" | "residual" | "swiglu", default "none");
//               packed_a (int, default 0): slot s of A_j holds a row-major [K, rank_j[s]] matrix;
//               norm_eps (float, default 1e-5): the RMSNorm's epsilon, with norm_weight;
//               split (ints, optional): the outputs' widths, summing to N;
//               act_bits (int, 8 | 16, default 8; ops ABI 13): 16 quantizes x to int16 codes per block (bits 8 only;
//               the int8 LM head, and the projections a build names, e.g. Gemma 3's q|k|v), 8 to int8; a LoRA
//               still reads x's int8 codes;
//               lora_layer (int, default -1): with it, A_j, A_scale_j, B_j, B_scale_j are stacks of every layer
//               ([n_layers, n_slots, ...], contract 7: a few graph inputs instead of four per layer and target)
//               and the node reads layer lora_layer of each.
#pragma once
#include <string>
#include <vector>

#include "../kernels/qlinear.h"
#include "op_util.h"

namespace ortllm {

struct QLinearKernel {
  QLinearKernel(const OrtApi& api, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  int64_t K_ = 0, N_ = 0, bits_ = 0, block_size_ = 0, act_bits_ = 8;
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
};

constexpr int kQLinearSegInputs = 5;  // per LoRA segment j: A_j, A_scale_j, B_j, B_scale_j, rank_j

struct QLinearOp : Ort::CustomOpBase<QLinearOp, QLinearKernel, true> {
  static constexpr size_t kInputs = 10 + kQLinearSegInputs * kQLinearMaxSegments + kQLinearMaxSegments;

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "QLinear"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return kInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const;
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const;
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
