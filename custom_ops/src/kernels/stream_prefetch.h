// The software prefetch of data a step reads once (QLinear's decode weights and their scales and offsets,
// PagedAttention's cached K/V rows at decode): which hint, by CPU vendor. Include it before any
// `#pragma GCC target`, so every unit's copy is compiled for the baseline ISA.
//
// NTA (non-temporal) was measured on AMD Zen 4 to keep the stream from evicting what the step reuses
// (qlinear_group_dot.h, paged_attention.cc cite the figures). On an Intel Xeon @ 2.50GHz (AVX-512 VNNI) the
// same NTA prefetch cost up to 40% of the decode speed: QLinear int4 at M = 1 on Llama-3.1-8B's shapes streamed
// 5.6-6.2 GB/s a thread with NTA, 6.3-8.9 with T0; bench/probes/engine_decode.py, the hint forced, alternating,
// medians of 3: TinyLlama shape B = 1 14.8 -> 23.7 tok/s, SmolLM2-135M B = 1 77.3 -> 98.9, after a 1984-token
// prompt 56.5 -> 66.8; B = 16 unchanged. So T0 on Intel, NTA elsewhere (AMD not re-measured with T0).
// ORTLLM_OPS_PREFETCH=t0|nta overrides the choice (A/B runs on a new CPU).
#pragma once

#include <cstdlib>
#include <string_view>

namespace ortllm {

// The hint for this CPU when ORTLLM_OPS_PREFETCH does not force one: true for T0.
bool stream_prefetch_t0_default();

// True: prefetch streams with T0; false: NTA. Decided once per process.
inline bool stream_prefetch_t0() {
  static const bool t0 = [] {
    if (const char* force = std::getenv("ORTLLM_OPS_PREFETCH")) {
      if (std::string_view(force) == "t0") return true;
      if (std::string_view(force) == "nta") return false;
    }
    return stream_prefetch_t0_default();
  }();
  return t0;
}

// One cache line of a stream at p, with the hint stream_prefetch_t0() chose (t0: its value, read once by the
// caller outside its loop). Prefetches never fault.
inline void prefetch_stream(const void* p, bool t0) {
  if (t0) {
    __builtin_prefetch(p, 0, 3);
  } else {
    __builtin_prefetch(p, 0, 0);
  }
}

}  // namespace ortllm
