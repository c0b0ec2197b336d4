// ORT wrapper of the MultiLoRA kernel (Lite custom-op API). Input/output order and attributes:
//   inputs : 0 x [T, in] f32, 1 base_y [T, out] f32, 2 A [n_slots, in, r_max] f16,
//            3 B [n_slots, r_max, out] f16, 4 scale [n_slots] f32, 5 rank [n_slots] i32,
//            6 token_adapter [T] i32 (-1 = no adapter),
//            7 offsets [ceil(in / block_size), out] f16, optional: the offset term of an asymmetric
//              quantized base projection, y += blocksum(x) @ offsets (kernels/block_offsets.h)
//   outputs: 0 y [T, out] f32 (may alias base_y: then nothing is copied)
//   attributes: block_size (int, required with offsets: the quantization block along in)
//               packed_a (int, default 0): 1 = slot s of A holds a row-major [in, rank[s]] matrix in its
//               first in * rank[s] elements (what the engine binds: no padding columns streamed)
#pragma once
#include "op_util.h"

#define ORT_API_MANUAL_INIT
#include <onnxruntime_lite_custom_op.h>
#undef ORT_API_MANUAL_INIT

namespace ortllm {

struct MultiLoraOp {
  MultiLoraOp(const OrtApi* api, const OrtKernelInfo* info);
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<float>& x,
                      const Ort::Custom::Tensor<float>& base_y, const Ort::Custom::Tensor<Ort::Float16_t>& A,
                      const Ort::Custom::Tensor<Ort::Float16_t>& B, const Ort::Custom::Tensor<float>& scale,
                      const Ort::Custom::Tensor<int32_t>& rank, const Ort::Custom::Tensor<int32_t>& token_adapter,
                      std::optional<const Ort::Custom::Tensor<Ort::Float16_t>*> offsets, Ort::Custom::Tensor<float>& y);

 private:
  int64_t block_size_ = 0;
  bool packed_a_ = false;
};

}  // namespace ortllm
