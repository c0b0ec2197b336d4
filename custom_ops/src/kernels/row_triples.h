// Row grouping shared by the attention inner loops that keep up to three query rows in registers (a decode
// token's kv head has G = 3 query heads in SmolLM2): f(std::integral_constant<int, R>{}, r0) for rows
// [r0, r0 + R), R = 3 while three remain, then one call with the 2 or 1 left. Baseline-ISA code (included
// before an ISA file's `#pragma GCC target`): it only calls f, whose body carries that file's ISA.
#pragma once
#include <type_traits>

namespace ortllm {

template <class F>
inline void for_row_triples(int rows, F&& f) {
  int r = 0;
  for (; r + 3 <= rows; r += 3) f(std::integral_constant<int, 3>{}, r);
  if (rows - r == 2) f(std::integral_constant<int, 2>{}, r);
  if (rows - r == 1) f(std::integral_constant<int, 1>{}, r);
}

}  // namespace ortllm
