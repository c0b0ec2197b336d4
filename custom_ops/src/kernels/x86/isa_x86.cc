// x86's kernel paths, best first (isa.h): "amx" (VNNI's tables with QLinear's two-group dots of 8 tokens or more on
// the AMX tile unit), "avx512vnni" (AVX2's tables with QLinear's and attention's integer dots and QLinear's panel
// GEMM on AVX-512 VNNI), "avx2" (AVX2 + FMA + F16C); the registry adds "scalar". Compiled for the baseline ISA: it
// only checks the CPU and hands out tables.
#include "isa_x86.h"
#include "../isa.h"
#include "../stream_prefetch.h"

namespace ortllm {
namespace {

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool make_amx(OpsIsa* row) {
  if (!cpu_has_avx2() || vec_vnni_ops() == nullptr || qlinear_amx_isa() == nullptr) return false;
  *row = {"amx", vec_vnni_ops(), qlinear_amx_isa()};
  return true;
}

bool make_vnni(OpsIsa* row) {
  if (!cpu_has_avx2() || vec_vnni_ops() == nullptr || qlinear_vnni_isa() == nullptr) return false;
  *row = {"avx512vnni", vec_vnni_ops(), qlinear_vnni_isa()};
  return true;
}

bool make_avx2(OpsIsa* row) {
  if (!cpu_has_avx2() || vec_avx2_ops() == nullptr || qlinear_avx2_isa() == nullptr) return false;
  *row = {"avx2", vec_avx2_ops(), qlinear_avx2_isa()};
  return true;
}

}  // namespace

std::vector<IsaCandidate> arch_isa_candidates() {
  return {{"amx", make_amx}, {"avx512vnni", make_vnni}, {"avx2", make_avx2}};
}

// T0 on Intel, NTA on others (stream_prefetch.h has the figures).
bool stream_prefetch_t0_default() {
  __builtin_cpu_init();
  return __builtin_cpu_is("intel") != 0;
}

}  // namespace ortllm
