// Kernel paths of an architecture without tables of its own (aarch64 today): only the portable scalar row, which
// the registry adds (isa.h). A NEON or SVE path would list its candidates here, best first, as x86/isa_x86.cc does.
#include "isa.h"
#include "stream_prefetch.h"

namespace ortllm {

std::vector<IsaCandidate> arch_isa_candidates() {
  return {};
}

bool stream_prefetch_t0_default() {
  return true;  // T0: the prefetch hint measured faster where it was measured on Intel (stream_prefetch.h)
}

}  // namespace ortllm
