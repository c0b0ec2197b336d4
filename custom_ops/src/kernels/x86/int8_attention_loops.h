// Scalar helpers shared by the AVX2 and AVX-512 VNNI int8 attention loops (vec_avx2.cc, vec_vnni.cc:
// scores_q8, pv_q16). Baseline-ISA code, included before a file's `#pragma GCC target`.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ortllm {

// Row grouping of the loops that keep up to three query rows in registers (a decode token's kv head has G = 3
// query heads in SmolLM2): f(std::integral_constant<int, R>{}, r0) for rows [r0, r0 + R), R = 3 while three
// remain, then one call with the 2 or 1 left. It only calls f, whose body carries the caller's ISA.
template <class F>
inline void for_row_triples(int rows, F&& f) {
  int r = 0;
  for (; r + 3 <= rows; r += 3) f(std::integral_constant<int, 3>{}, r);
  if (rows - r == 2) f(std::integral_constant<int, 2>{}, r);
  if (rows - r == 1) f(std::integral_constant<int, 1>{}, r);
}

// pv_q16's 32-bit weight pair (W[j], W[j + 1]) of keys j and j + 1, broadcast against two keys' interleaved
// int16 value codes; only W[j] for a last odd key (W[j + 1] may lie past the row).
inline int32_t weight_pair(const int16_t* w, int j, int nkeys) {
  if (j + 1 >= nkeys) return static_cast<uint16_t>(w[j]);
  int32_t p;
  std::memcpy(&p, w + j, sizeof p);
  return p;
}

}  // namespace ortllm
