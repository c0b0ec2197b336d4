// The registry of kernel paths (isa.h): the architecture's candidates that this build and CPU run, then scalar.
#include <cstdlib>

#include "isa.h"
#include "qlinear.h"
#include "vec.h"

namespace ortllm {
namespace {

OpsIsa scalar_row() {
  return {"scalar", &vec_scalar_ops(), &qlinear_scalar_isa()};
}

}  // namespace

const std::vector<OpsIsa>& supported_isas() {
  static const std::vector<OpsIsa> rows = [] {
    std::vector<OpsIsa> out;
    for (const IsaCandidate& c : arch_isa_candidates()) {
      OpsIsa row{};
      if (c.make(&row)) out.push_back(row);
    }
    out.push_back(scalar_row());
    return out;
  }();
  return rows;
}

const OpsIsa* find_isa(std::string_view name) {
  for (const OpsIsa& row : supported_isas())
    if (name == row.name) return &row;
  return nullptr;
}

const OpsIsa& default_isa() {
  static const OpsIsa* chosen = [] {
    const char* env = std::getenv("ORTLLM_OPS_ISA");
    const std::string_view force = env ? env : "";
    if (force.empty()) return &supported_isas().front();
    if (const OpsIsa* row = find_isa(force)) return row;
    // a candidate this CPU lacks: the best supported one after it in the architecture's order
    const std::vector<IsaCandidate> order = arch_isa_candidates();
    for (size_t i = 0; i < order.size(); ++i) {
      if (force != order[i].name) continue;
      for (size_t j = i + 1; j < order.size(); ++j)
        if (const OpsIsa* row = find_isa(order[j].name)) return row;
      return find_isa("scalar");
    }
    return &supported_isas().front();
  }();
  return *chosen;
}

std::string supported_isa_names() {
  std::string s;
  for (const OpsIsa& row : supported_isas()) s += (s.empty() ? "" : ", ") + std::string(row.name);
  return s;
}

}  // namespace ortllm
