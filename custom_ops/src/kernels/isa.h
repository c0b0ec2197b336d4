// The ops' kernel paths ("ISAs") as data: one row per path, each naming the tables its kernels call, candidates
// best first per architecture, chosen per session.
//
// A row is a pair of tables (vec.h VecOps: attention and LoRA loops; qlinear.h QLinearIsa: QLinear's
// micro-kernels). Each architecture lists its candidates in one file (x86: x86/isa_x86.cc; any other: isa_generic.cc,
// which has none), and every architecture ends with the portable "scalar" row, so the library builds and runs
// anywhere. The registry keeps the rows this build and this CPU support; a session names one (the session config
// entry kSessionIsaKey, runtime/ops_library.py register_ops), or takes the default: ORTLLM_OPS_ISA where it names a
// row, else the first. Every row gives the same bits (the tests compare them in one process).
// Adding a path: a table file and one candidate line (docs/howto-add-an-isa.md).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace ortllm {

struct VecOps;
struct QLinearIsa;

struct OpsIsa {
  const char* name;
  const VecOps* vec;
  const QLinearIsa* qlinear;
};

// One candidate of an architecture: make() fills the row and says whether this build and CPU can run it.
struct IsaCandidate {
  const char* name;
  bool (*make)(OpsIsa* row);
};

// The architecture's candidates, best first, the scalar row excluded (defined by the one arch file compiled in).
std::vector<IsaCandidate> arch_isa_candidates();

// The session config entry that names a session's path (its value: a row's name).
constexpr const char* kSessionIsaKey = "ortllm.ops_isa";

// The rows this build and CPU run, best first; "scalar" last.
const std::vector<OpsIsa>& supported_isas();
// The row named name, or nullptr when this build or CPU lacks it.
const OpsIsa* find_isa(std::string_view name);
// ORTLLM_OPS_ISA's row; where it names a candidate this CPU lacks, the best supported one after it in the
// architecture's order (avx512vnni on an AVX2-only CPU: avx2); unset or unknown: the first row.
const OpsIsa& default_isa();
// "amx, avx512vnni, avx2, scalar": the supported rows' names, best first (for messages and OrtllmOpsIsas).
std::string supported_isa_names();

}  // namespace ortllm
