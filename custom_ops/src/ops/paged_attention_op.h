// ORT wrapper of the PagedAttention kernel (Lite custom-op API), registered twice under the same
// name: CacheT = float (kv_dtype "float32") and CacheT = uint8_t (kv_dtype "int8" / "fp8_e4m3").
//   inputs : 0 q [T, H*D] f32, 1 k [T, Hkv*D] f32, 2 v [T, Hkv*D] f32 (k, q before RoPE),
//            3 positions [T] i32, 4 cu_seqlens [S+1] i32, 5 context_lens [S] i32,
//            6 block_tables [S, max_blocks] i32, 7 cos_cache [max_pos, D/2] f32,
//            8 sin_cache [max_pos, D/2] f32, 9 key_cache [NB, Hkv, BS, D] CacheT,
//            10 value_cache [NB, Hkv, BS, D] CacheT,
//            11 key_scales [NB, Hkv, BS] f16 (optional; required for 8-bit),
//            12 value_scales [NB, Hkv, BS] f16 (optional; required for 8-bit)
//   outputs: 0 attn [T, H*D] f32, 1 key_cache_out, 2 value_cache_out (same shape/type as inputs),
//            3 key_scales_out, 4 value_scales_out (optional; required for 8-bit)
//   Cache outputs alias cache inputs when bound to the same buffer (nothing copied then).
//   attributes: num_heads, kv_num_heads, head_size, block_size (int, required);
//            kv_dtype (string "float32" | "int8" | "fp8_e4m3", default "float32");
//            rotate (int, default 1 for 8-bit, 0 for float32); scale (float, default 1/sqrt(D));
//            rope_interleaved (int, default 0 = HF rotate_half pairs (i, i + D/2)).
#pragma once
#include <optional>
#include <string>

#include "../kernels/quant.h"
#include "op_util.h"

#define ORT_API_MANUAL_INIT
#include <onnxruntime_lite_custom_op.h>
#undef ORT_API_MANUAL_INIT

namespace ortllm {

template <typename CacheT>
struct PagedAttentionOp {
  using F32 = Ort::Custom::Tensor<float>;
  using I32 = Ort::Custom::Tensor<int32_t>;
  using F16 = Ort::Custom::Tensor<Ort::Float16_t>;  // the 8-bit caches' per-row scales
  using Cache = Ort::Custom::Tensor<CacheT>;

  PagedAttentionOp(const OrtApi* api, const OrtKernelInfo* info);
  Ort::Status Compute(OrtKernelContext* ctx, const F32& q, const F32& k, const F32& v, const I32& positions,
                      const I32& cu_seqlens, const I32& context_lens, const I32& block_tables, const F32& cos_cache,
                      const F32& sin_cache, const Cache& key_cache, const Cache& value_cache,
                      std::optional<const F16*> key_scales, std::optional<const F16*> value_scales, F32& attn,
                      Cache& key_cache_out, Cache& value_cache_out, std::optional<F16*> key_scales_out,
                      std::optional<F16*> value_scales_out);

 private:
  int64_t num_heads_, kv_heads_, head_size_, block_size_;
  KvDtype kv_dtype_ = KvDtype::kFloat32;
  bool rotate_ = false, interleaved_ = false;
  float scale_ = 0.f;
  std::string init_error_;  // attribute problems, reported by the first Compute (no throwing)
};

}  // namespace ortllm
