// Whether AMX tile work and 512-bit vector work overlap on this core: QLinear's AMX kernel per block (qlinear_amx.cc)
// is a tile chain (zero C, load B [8 x 64], load A [16 x 32], TDPBSSD, store C) and a float epilogue for 16 tokens
// (cvt, mul, fma, fma on 16 lanes); this times each alone and both interleaved, everything in L1
// (docs/notes/benchmarks.md, "QLinear on AMX tiles"). Needs AMX-INT8 and Linux >= 5.16.
//   g++ -O3 -mamx-tile -mamx-int8 -mavx512f -mavx512vl -mf16c -mfma bench/probes/amx_overlap.cc -o /tmp/amx_overlap
//   /tmp/amx_overlap
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
alignas(64) static int8_t act[64 * 16 * 32], wts[64 * 512];
alignas(64) static int32_t sums[3][16][16];
alignas(64) static float dx[16 * 64], sx[16 * 64];
alignas(64) static uint16_t d16[64 * 16], m16[64 * 16];

// ns per block of 64 blocks x 20000 rounds, with the tile chain (TILE) and / or the epilogue two blocks behind (EPI)
template <bool TILE, bool EPI>
__attribute__((noinline)) double run(float* sink) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  constexpr int kb = 64;
  constexpr long rounds = 20000;
  const auto t0 = std::chrono::steady_clock::now();
  for (long r = 0; r < rounds; ++r)
    for (int b = 0; b < kb; ++b) {
      if (TILE) {  // two tile sets, alternating (as the kernel)
        if (b & 1) {
          _tile_zero(3);
          _tile_loadd(5, wts + b * 512, 64);
          _tile_loadd(4, act + b * 512, 32);
          _tile_dpbssd(3, 4, 5);
          _tile_stored(3, sums[b % 3], 64);
        } else {
          _tile_zero(0);
          _tile_loadd(2, wts + b * 512, 64);
          _tile_loadd(1, act + b * 512, 32);
          _tile_dpbssd(0, 1, 2);
          _tile_stored(0, sums[b % 3], 64);
        }
      }
      if (EPI) {
        const int e = (b + 1) % 3;
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d16 + b * 16)));
        const __m512 m = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(m16 + b * 16)));
        for (int t = 0; t < 16; ++t) {
          const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(sums[e][t]));
          acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[t * kb + b])), isum, acc[t]);
          acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[t * kb + b]), acc[t]);
        }
      }
    }
  const auto t1 = std::chrono::steady_clock::now();
  __m512 s = acc[0];
  for (int t = 1; t < 16; ++t) s = _mm512_add_ps(s, acc[t]);
  _mm512_storeu_ps(sink, s);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (rounds * kb);
}

int main() {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) {
    std::puts("no AMX here (or the kernel refused its tile state)");
    return 1;
  }
  TileConfig cfg;
  for (int s = 0; s < 2; ++s) {
    cfg.rows[3 * s] = 16, cfg.colsb[3 * s] = 64;          // C [16 tokens x 16 rows] int32
    cfg.rows[3 * s + 1] = 16, cfg.colsb[3 * s + 1] = 32;  // A [16 tokens x 32 codes]
    cfg.rows[3 * s + 2] = 8, cfg.colsb[3 * s + 2] = 64;   // B [8 k-quads x 16 rows x 4]
  }
  _tile_loadconfig(&cfg);
  alignas(64) float sink[16];
  for (int i = 0; i < 3; ++i)
    std::printf("ns a block: tile chain %.2f, epilogue %.2f, both %.2f\n", run<true, false>(sink),
                run<false, true>(sink), run<true, true>(sink));
  _tile_release();
  return sink[0] == 12345.f;
}
