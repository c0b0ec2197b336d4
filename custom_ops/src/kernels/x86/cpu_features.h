// Run-time CPU checks shared by the ISA tables (compiled for the baseline ISA).
#pragma once

namespace ortllm {

// AVX-512 F, VL, BW and VNNI: what the 512-bit integer-dot kernels (qlinear_vnni.cc, vec_vnni.cc) use.
inline bool cpu_has_avx512_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}

}  // namespace ortllm
