// ORT-facing wrapper of MultiLoRA: shape/index validation (every error names the input and the
// bad value), output aliasing (copy base_y only when y is another buffer), then the pure kernels
// (the optional block offsets, then the adapters) on the session's intra-op pool.
#include "multi_lora_op.h"

#include <cstring>

#include "../kernels/block_offsets.h"
#include "../kernels/multi_lora.h"

namespace ortllm {

static_assert(sizeof(Ort::Float16_t) == sizeof(uint16_t), "A, B and offsets are read as fp16 bits");

MultiLoraOp::MultiLoraOp(const OrtApi* api, const OrtKernelInfo* info)
    : block_size_(attr_int(api, info, "block_size", 0)), packed_a_(attr_int(api, info, "packed_a", 0) != 0) {}

Ort::Status MultiLoraOp::Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<float>& x,
                                 const Ort::Custom::Tensor<float>& base_y, const Ort::Custom::Tensor<Ort::Float16_t>& A,
                                 const Ort::Custom::Tensor<Ort::Float16_t>& B, const Ort::Custom::Tensor<float>& scale,
                                 const Ort::Custom::Tensor<int32_t>& rank,
                                 const Ort::Custom::Tensor<int32_t>& token_adapter,
                                 std::optional<const Ort::Custom::Tensor<Ort::Float16_t>*> offsets,
                                 Ort::Custom::Tensor<float>& y) {
  constexpr const char* op = "MultiLoRA";
  try {
    const auto& xs = x.Shape();
    if (xs.size() != 2) fail(op, ": input 'x' must be [T, in]; got shape ", shape_str(xs));
    const int64_t T = xs[0], in = xs[1];
    const auto& As = A.Shape();
    if (As.size() != 3) fail(op, ": input 'A' must be [n_slots, in, r_max]; got shape ", shape_str(As));
    const int64_t n_slots = As[0], r_max = As[2];
    expect_shape(op, "A", As, {-1, in, -1});
    const auto& ys = base_y.Shape();
    if (ys.size() != 2) fail(op, ": input 'base_y' must be [T, out]; got shape ", shape_str(ys));
    const int64_t out = ys[1];
    expect_shape(op, "base_y", ys, {T, out});
    expect_shape(op, "B", B.Shape(), {n_slots, r_max, out});
    expect_shape(op, "scale", scale.Shape(), {n_slots});
    expect_shape(op, "rank", rank.Shape(), {n_slots});
    expect_shape(op, "token_adapter", token_adapter.Shape(), {T});
    const int32_t* rk = rank.Data();
    for (int64_t s = 0; s < n_slots; ++s)
      if (rk[s] < 0 || rk[s] > r_max)
        fail(op, ": input 'rank'[", s, "] = ", rk[s], " is outside [0, r_max = ", r_max, "]");
    const int32_t* ta = token_adapter.Data();
    for (int64_t t = 0; t < T; ++t)
      if (ta[t] < -1 || ta[t] >= n_slots)
        fail(op, ": input 'token_adapter'[", t, "] = ", ta[t], " is not -1 or a slot in [0, ", n_slots, ")");

    const uint16_t* off = nullptr;
    if (offsets.has_value() && *offsets != nullptr) {
      if (block_size_ <= 0)
        fail(op, ": input 'offsets' needs attribute block_size > 0; got block_size = ", block_size_);
      expect_shape(op, "offsets", (*offsets)->Shape(), {(in + block_size_ - 1) / block_size_, out});
      off = reinterpret_cast<const uint16_t*>((*offsets)->Data());  // Float16_t is the fp16 bits
    }

    float* yp = y.Allocate({T, out});
    const float* bp = base_y.Data();
    if (yp != bp && T * out > 0) std::memcpy(yp, bp, sizeof(float) * static_cast<size_t>(T * out));
    if (T == 0 || out == 0) return Ort::Status{nullptr};

    Parallel par{ort_parallel_for, ctx};
    if (off != nullptr) add_block_offsets({T, in, out, block_size_}, x.Data(), off, yp, par);
    MultiLoraDims dims{T, in, out, n_slots, r_max, packed_a_};
    MultiLoraArgs args{x.Data(),
                       reinterpret_cast<const uint16_t*>(A.Data()),
                       reinterpret_cast<const uint16_t*>(B.Data()),
                       scale.Data(),
                       rk,
                       ta,
                       yp};
    multi_lora(dims, args, par);
    return Ort::Status{nullptr};
  } catch (const OpError& e) {
    return Ort::Status(e.what(), ORT_INVALID_ARGUMENT);
  } catch (const std::exception& e) {
    return Ort::Status((std::string(op) + ": " + e.what()).c_str(), ORT_RUNTIME_EXCEPTION);
  } catch (...) {
    return Ort::Status("MultiLoRA: unknown error", ORT_RUNTIME_EXCEPTION);
  }
}

}  // namespace ortllm
