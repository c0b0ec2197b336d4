// The x86 tables (each defined in its own unit under `#pragma GCC target`), handed out by x86/isa_x86.cc only.
// Each returns nullptr when the build lacks it; the CPU checks are isa_x86.cc's (but VNNI's and AMX's own, which
// their units make since the rows above them build on the tables below).
#pragma once

namespace ortllm {

struct VecOps;
struct QLinearIsa;

const VecOps* vec_avx2_ops();
// AVX2's table with the int8 attention loops on AVX-512 VNNI (scores_q8 on dpbusd, pv_q16 on dpwssd);
// nullptr when the build or the CPU lacks AVX-512 F/BW/VL/VNNI.
const VecOps* vec_vnni_ops();

const QLinearIsa* qlinear_avx2_isa();
const QLinearIsa* qlinear_vnni_isa();  // nullptr without a CPU with AVX-512 VNNI (+VL, BW)
const QLinearIsa* qlinear_amx_isa();   // nullptr without the VNNI table, AMX-INT8, or the kernel's permission for it

}  // namespace ortllm
