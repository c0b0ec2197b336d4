// Two 8-row groups in one 512-bit vector (lanes 0-7 group 0's rows, lanes 8-15 group 1's), shared by the AVX-512
// VNNI and the AMX translation units' two-group kernels (group_dot2). Include it only inside an anonymous namespace
// of such a unit, after its `#pragma GCC target(...)` with avx512f/vl/bw and every system header (as
// qlinear_group_dot.h): each unit compiles its own copy for its own ISA. The unit includes <vector>.

// The calling thread's panel of `vectors` 64-byte vectors (a two-group GEMM's staged weights), grown to the largest
// it has seen; one per unit that includes this file.
inline __m512i* panel_vectors(size_t vectors) {
  struct alignas(64) Vec {
    int8_t bytes[64];
  };
  static thread_local std::vector<Vec> buffer;
  buffer.resize(vectors);
  return reinterpret_cast<__m512i*>(buffer.data());
}

inline __m512i load_pair(const uint8_t* a, const uint8_t* b) {  // 32 bytes of each group's codes
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

inline __m512 load_f16_pair(const uint16_t* a, const uint16_t* b) {  // 8 fp16 of each group
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1));
}

// Token t's accumulators of both groups (out0, out1 as group_dot2's: [t * 8 + r] floats), and back.
inline __m512 load_acc_pair(const float* out0, const float* out1, int t) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(out0 + 8 * t))),
                                             _mm256_castps_pd(_mm256_loadu_ps(out1 + 8 * t)), 1));
}

inline void store_acc_pair(__m512 acc, float* out0, float* out1, int t) {
  _mm256_storeu_ps(out0 + 8 * t, _mm512_castps512_ps256(acc));
  _mm256_storeu_ps(out1 + 8 * t, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}

// Block b's float step for nt tokens of both groups, each lane's group_dot_t's: acc[t] = fma(d * dx(t), float(isum(t)),
// acc[t]), then with block offsets fma(m, sx(t), acc[t]). isum(t): token t's exact integer sums of the 16 rows; dx(t),
// sx(t): its block scales (from QTokens' rows: epilogue_pair, or AMX's by tiles: epilogue_pair_tiles).
template <class Isum, class Dx, class Sx>
__attribute__((always_inline)) inline void epilogue_scaled(const QGroup& g0, const QGroup& g1, int b, int nt, Isum isum,
                                                           Dx dx, Sx sx, __m512* acc) {
  const __m512 d = load_f16_pair(g0.d + b * 8, g1.d + b * 8);
#pragma GCC unroll 16
  for (int t = 0; t < nt; ++t)
    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx(t))), _mm512_cvtepi32_ps(isum(t)), acc[t]);
  if (g0.m) {
    const __m512 m = load_f16_pair(g0.m + b * 8, g1.m + b * 8);
#pragma GCC unroll 16
    for (int t = 0; t < nt; ++t) acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx(t)), acc[t]);
  }
}

// epilogue_scaled with x's scales from its rows (x.dx[t * kb + b]).
template <class Isum>
__attribute__((always_inline)) inline void epilogue_pair(const QGroup& g0, const QGroup& g1, const QTokens& x, int b,
                                                         int nt, Isum isum, __m512* acc) {
  const int kb = g0.kb;
  epilogue_scaled(
      g0, g1, b, nt, isum, [&](int t) { return x.dx[t * kb + b]; }, [&](int t) { return x.sx[t * kb + b]; }, acc);
}

// epilogue_scaled with x's scales by tiles (QTokens::dx_tiles / sx_tiles): each token's at a fixed offset from the
// block's pointer (x.dx[t * kb + b] took a register a token in AMX's 16-token pass: they spilled).
template <class Isum>
__attribute__((always_inline)) inline void epilogue_pair_tiles(const QGroup& g0, const QGroup& g1, const QTokens& x,
                                                               int b, int nt, Isum isum, __m512* acc) {
  const float* dx = x.dx_tiles + b * kCodeTile;
  const float* sx = x.sx_tiles + b * kCodeTile;
  epilogue_scaled(
      g0, g1, b, nt, isum, [&](int t) { return dx[t]; }, [&](int t) { return sx[t]; }, acc);
}
