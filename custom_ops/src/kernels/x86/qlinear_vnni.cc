// AVX-512 VNNI QLinear micro-kernels (AVX512VL + AVX512_VNNI), picked at run time where the CPU has it (AMD
// Zen 4 and later, Intel Ice Lake and later): the group dots, the panel GEMM for many tokens (gemm: two groups'
// int4 weights unpacked once for a work item's tokens), and the LoRA's integer shrink (dpbusd, 16 ranks a vector)
// and expand (dpbusd, 16 columns a vector); quantize_row and the gated epilogues are AVX2's.
//
// _mm256_dpbusd_epi32 multiplies 4 unsigned codes by 4 signed activation bytes and adds the 4 products
// into a 32-bit lane in one instruction, where AVX2 needs maddubs + add (+ madd to widen). The sums are
// exact integers either way, so this path gives the same isum, hence the same bits, as AVX2 and scalar.
// A block's products are spread over several accumulators per token (independent dependency chains:
// one token alone would otherwise wait on dpbusd's latency 8 times per sub-block) and added at the end.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../qlinear.h"
#include "../stream_prefetch.h"
#include "cpu_features.h"
#include "isa_x86.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
// GCC 12's 512-bit intrinsics pass _mm512_undefined_*() as the unused merge source and then warn about it
// (a known false positive); the vectors they build are fully defined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ortllm {
namespace vnni {
namespace {

#include "qlinear_group_dot.h"
#include "qlinear_pair.h"

struct Dots {
  template <int NT, int BITS>
  static const uint8_t* block(const uint8_t* codes, int sub_blocks, const int8_t* const* qs, const int32_t* zs,
                              __m256i* isum) {
    constexpr int kChains = NT == 1 ? 4 : 2;  // accumulators per token (rotated per 4-byte word): >= 8 in all
    __m256i a[NT][kChains];
    for (int t = 0; t < NT; ++t) {
      a[t][0] = _mm256_set1_epi32(-zs[t]);
      for (int c = 1; c < kChains; ++c) a[t][c] = _mm256_setzero_si256();
    }
    for (int s = 0; s < sub_blocks; ++s, codes += 32 * BITS) {
      if (BITS == 4) {
        __m256i v[8];
        unpack4(codes, v);
        for (int t = 0; t < NT; ++t)
          for (int j = 0; j < 8; ++j)
            a[t][j % kChains] = _mm256_dpbusd_epi32(a[t][j % kChains], v[j], bcast_word(qs[t] + 32 * s + 4 * j));
      } else {  // int8: |w| x sign(x, w), as AVX2 (dpbusd's first operand is unsigned)
        for (int j = 0; j < 8; ++j) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * j));
          const __m256i aw = _mm256_abs_epi8(w);
          for (int t = 0; t < NT; ++t)
            a[t][j % kChains] =
                _mm256_dpbusd_epi32(a[t][j % kChains], aw, _mm256_sign_epi8(bcast_word(qs[t] + 32 * s + 4 * j), w));
        }
      }
    }
    for (int t = 0; t < NT; ++t) {  // exact integer sums: any order gives the same isum
      isum[t] = a[t][0];
      for (int c = 1; c < kChains; ++c) isum[t] = _mm256_add_epi32(isum[t], a[t][c]);
    }
    return codes;
  }
};

void group_dot(const QGroup& g, const QTokens& x, int nt, float* out) {
  group_dot_any<Dots>(g, x, nt, out);
}

// act_bits 16: AVX2's Dots16 with _mm256_dpwssd_epi32 (int16 pairs' products added into the int32 lanes in one
// instruction, where AVX2 needs madd + add); two chains per half when a token is alone or paired (dpwssd's latency).
struct Dots16 {
  template <int NT>
  static void block(const uint8_t* codes, int sub_blocks, const int16_t* const* qs, __m256i* lo, __m256i* hi) {
    constexpr int kChains = NT <= 2 ? 2 : 1;
    __m256i l[NT][kChains], h[NT][kChains];
    for (int t = 0; t < NT; ++t)
      for (int c = 0; c < kChains; ++c) l[t][c] = h[t][c] = _mm256_setzero_si256();
    for (int s = 0; s < sub_blocks; ++s, codes += 256) {
      for (int i = 0; i < 8; ++i) {
        __m256i wlo, whi;
        widen8(codes + 32 * i, &wlo, &whi);
        for (int t = 0; t < NT; ++t) {
          const __m256i xq = bcast_quad16(qs[t] + 32 * s + 4 * i);
          l[t][i % kChains] = _mm256_dpwssd_epi32(l[t][i % kChains], wlo, xq);
          h[t][i % kChains] = _mm256_dpwssd_epi32(h[t][i % kChains], whi, xq);
        }
      }
    }
    for (int t = 0; t < NT; ++t) {  // exact integer sums: any order gives the same lanes
      lo[t] = l[t][0], hi[t] = h[t][0];
      for (int c = 1; c < kChains; ++c)
        lo[t] = _mm256_add_epi32(lo[t], l[t][c]), hi[t] = _mm256_add_epi32(hi[t], h[t][c]);
    }
  }
};

void group_dot16(const QGroup& g, const QTokens& x, int nt, float* out) {
  group_dot16_any<Dots16>(g, x, nt, out);
}

// ---- two groups in one 512-bit vector: lanes 0-7 group 0's rows, lanes 8-15 group 1's. Every broadcast word
// of x and every dpbusd, cvt and fma then serves 16 rows; each lane's operations are group_dot_t's, so the
// bits are those of two group_dot calls.

// isum[t] for one int4 block of both groups (as Dots::block for 8 rows); returns the codes past it.
template <int NT>
void block4_pair(const uint8_t*& c0, const uint8_t*& c1, int sub_blocks, const int8_t* const* qs, const int32_t* zs,
                 __m512i* isum) {
  constexpr int kChains = NT == 1 ? 4 : 2;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i a[NT][kChains];
  for (int t = 0; t < NT; ++t) {
    a[t][0] = _mm512_set1_epi32(-zs[t]);
    for (int c = 1; c < kChains; ++c) a[t][c] = _mm512_setzero_si512();
  }
  for (int s = 0; s < sub_blocks; ++s, c0 += 128, c1 += 128) {
    __m512i v[8];
    for (int j = 0; j < 4; ++j) {
      const __m512i w = load_pair(c0 + 32 * j, c1 + 32 * j);
      v[2 * j] = _mm512_and_si512(w, low);
      v[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    }
    for (int t = 0; t < NT; ++t)
      for (int j = 0; j < 8; ++j) {
        int32_t word;
        std::memcpy(&word, qs[t] + 32 * s + 4 * j, 4);
        a[t][j % kChains] = _mm512_dpbusd_epi32(a[t][j % kChains], v[j], _mm512_set1_epi32(word));
      }
  }
  for (int t = 0; t < NT; ++t) {
    isum[t] = a[t][0];
    for (int c = 1; c < kChains; ++c) isum[t] = _mm512_add_epi32(isum[t], a[t][c]);
  }
}

template <int NT>
void group_dot2_t(const QGroup& g0, const QGroup& g1, const QTokens& x, float* out0, float* out1) {
  const int sub_blocks = g0.bs / 32;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t)  // 0 or the LoRA terms (qlinear.h)
    acc[t] = load_acc_pair(out0, out1, t);
  const uint8_t *c0 = g0.codes, *c1 = g1.codes;
  for (int b = 0; b < g0.kb; ++b) {
    __m512i isum[NT];
    const int8_t* qs[NT];
    int32_t zs[NT];
    for (int t = 0; t < NT; ++t) qs[t] = x.q + t * x.q_stride + b * g0.bs, zs[t] = x.zsum[t * g0.kb + b];
    block4_pair<NT>(c0, c1, sub_blocks, qs, zs, isum);
    epilogue_pair(
        g0, g1, x, b, NT, [&](int t) { return isum[t]; }, acc);
  }
  for (int t = 0; t < NT; ++t) store_acc_pair(acc[t], out0, out1, t);
}

void group_dot2(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0, float* out1) {
  if (g0.bits != 4) {  // int8 codes: AVX-512BW has no sign_epi8; the 8-row path per group
    group_dot(g0, x, nt, out0);
    group_dot(g1, x, nt, out1);
    return;
  }
  switch (nt) {
    case 4:
      group_dot2_t<4>(g0, g1, x, out0, out1);
      break;
    case 3:
      group_dot2_t<3>(g0, g1, x, out0, out1);
      break;
    case 2:
      group_dot2_t<2>(g0, g1, x, out0, out1);
      break;
    default:
      group_dot2_t<1>(g0, g1, x, out0, out1);
      break;
  }
}

// ---- act_bits 16 on two int8 groups at once (group_dot2_16): each int16 code q = 256 hi + lo split into bytes
// (QTokens::q16_lo unsigned, q16_hi signed; the driver writes them once a call), as AMX's dot2_tile16 does. Per k-quad
// and token: S_lo += dpbusd(lo, w) (unsigned codes x signed weights), S_hi += dpbusd(w ^ 0x80, hi) (the weights biased
// to unsigned, the high bytes signed: AVX-512BW has no sign_epi8), S_hi seeded with -128 x the block's high-byte sum
// (QTokens::q16_hi_sum, summed once a call by the driver). isum = 256 S_hi + S_lo = sum w q exactly (|isum| < 2^31 for
// bs <= 128, qlinear.h; int8 weights: zero point 0), then group_dot16_t's float steps per block: the bits of two
// group_dot16 calls.
template <int NT>
void group_dot2_16_t(const QGroup& g0, const QGroup& g1, const QTokens& x, float* out0, float* out1) {
  const int subs = g0.bs / 32, kb = g0.kb;
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = load_acc_pair(out0, out1, t);  // 0 or the LoRA terms (qlinear.h)
  const uint8_t *c0 = g0.codes, *c1 = g1.codes;
  for (int b = 0; b < kb; ++b) {
    __m512i lo_sum[NT], hi_sum[NT];  // hi_sum: sum w hi, from -128 sum hi (the bias's part) on
    for (int t = 0; t < NT; ++t)
      lo_sum[t] = _mm512_setzero_si512(), hi_sum[t] = _mm512_set1_epi32(-128 * x.q16_hi_sum[t * kb + b]);
    for (int s = 0; s < subs; ++s, c0 += 256, c1 += 256) {
      const int64_t k = static_cast<int64_t>(b) * g0.bs + 32 * s;
      for (int i = 0; i < 8; ++i) {
        const __m512i w = load_pair(c0 + 32 * i, c1 + 32 * i);
        const __m512i wb = _mm512_xor_si512(w, bias);
        for (int t = 0; t < NT; ++t) {
          int32_t lo, hi;
          std::memcpy(&lo, x.q16_lo + t * x.q_stride + k + 4 * i, 4);
          std::memcpy(&hi, x.q16_hi + t * x.q_stride + k + 4 * i, 4);
          lo_sum[t] = _mm512_dpbusd_epi32(lo_sum[t], _mm512_set1_epi32(lo), w);
          hi_sum[t] = _mm512_dpbusd_epi32(hi_sum[t], wb, _mm512_set1_epi32(hi));
        }
      }
    }
    epilogue_pair(
        g0, g1, x, b, NT, [&](int t) { return _mm512_add_epi32(_mm512_slli_epi32(hi_sum[t], 8), lo_sum[t]); }, acc);
  }
  for (int t = 0; t < NT; ++t) store_acc_pair(acc[t], out0, out1, t);
}

void group_dot2_16(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0, float* out1) {
  with_tokens(nt, [&](auto n) { group_dot2_16_t<decltype(n)::value>(g0, g1, x, out0, out1); });
}

// ---- the panel GEMM: a paired int4 or int8 tile of more than kQTile tokens (a work item's token chunk, up to
// kGemmTokensMax). Both groups' codes are unpacked once for all of K into a panel (per sub-block the 8 vectors
// block4_pair builds: 512 bytes, 16 x K / 2 bytes in all: 32 KB at K = 2048, in L1 / L2) and swept by every
// kPanelTokens tokens of the tile, instead of unpacked again for every kQTile tokens (a 512-token prefill unpacked
// each weight 128 times). Per block and token: block4_pair's integer sums (seeded -zs, exact in any order) and
// epilogue_pair's float steps, so the same bits as group_dot2.
constexpr int kPanelTokens = 8;  // tokens a sweep: 8 accumulators + 8 sums in registers, one chain a token
static_assert(kCodeTile % kPanelTokens == 0, "a sweep reads one tile of codes");

// Both groups' codes of all kb blocks as dpbusd's unsigned bytes, k-quad j of sub-block s at panel[8 s + j] (16 rows,
// row r's 4 codes in lane r): int4 codes as they are (0..15, block4_pair's v[j]); int8 codes biased by 128 (w ^ 0x80 =
// w + 128 in 0..255: AVX-512BW has no sign_epi8 for AVX2's |w| x sign(x, w)), the bias taken back off with the
// tokens' code sums (panel_sweep).
template <int BITS>
void stage_panel(const QGroup& g0, const QGroup& g1, __m512i* panel) {
  const int64_t subs = static_cast<int64_t>(g0.kb) * (g0.bs / 32);
  if (BITS == 4) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t s = 0; s < subs; ++s, panel += 8)
      for (int j = 0; j < 4; ++j) {
        const __m512i w = load_pair(g0.codes + 128 * s + 32 * j, g1.codes + 128 * s + 32 * j);
        _mm512_store_si512(panel + 2 * j, _mm512_and_si512(w, low));
        _mm512_store_si512(panel + 2 * j + 1, _mm512_and_si512(_mm512_srli_epi16(w, 4), low));
      }
  } else {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t s = 0; s < subs; ++s, panel += 8)
      for (int i = 0; i < 8; ++i)
        _mm512_store_si512(panel + i,
                           _mm512_xor_si512(load_pair(g0.codes + 256 * s + 32 * i, g1.codes + 256 * s + 32 * i), bias));
  }
}

// Where a sweep reads its tokens' codes and scales: by tiles (QTokens::q_tiles from the sweep's first token's row in
// its tile: block b's codes of token t at q + b * kCodeTile * bs + t * bs, its dx and sx at + b * kCodeTile + t).
struct Acts {
  const int8_t* q;
  const float *dx, *sx;
  const int32_t* qsum;  // int8 weights: the code sums (QTokens::qsum_tiles), else nullptr
};

// NT tokens against blocks [b0, b1) of the staged panel: group_dot2_t's sums and float steps, the weights read from
// the panel. BS: the block size as a constant (32: every token's word an immediate offset from one pointer), or 0. The
// accumulators start from out's values and go back there (exact: a float stored and loaded).
template <int BITS, int NT, int BS>
void panel_sweep(const QGroup& g0, const QGroup& g1, const __m512i* panel, int b0, int b1, const Acts& x,
                 const int32_t* zsum, int kb, float* out0, float* out1) {
  const int bs = BS > 0 ? BS : g0.bs, subs = bs / 32;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = load_acc_pair(out0, out1, t);  // 0, the LoRA terms or blocks < b0's sums
  panel += static_cast<int64_t>(b0) * subs * 8;
  for (int b = b0; b < b1; ++b) {
    __m512i isum[NT];             // one chain a token: NT independent dpbusd chains (two a token measured the same)
    for (int t = 0; t < NT; ++t)  // int4: less zp * qsum; int8: less the bias's 128 * qsum (zsum 0)
      isum[t] = _mm512_set1_epi32(BITS == 4 ? -zsum[t * kb + b] : -128 * x.qsum[b * kCodeTile + t]);
    const int8_t* q = x.q + static_cast<int64_t>(b) * kCodeTile * bs;
    for (int s = 0; s < subs; ++s, panel += 8, q += 32) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512i w = _mm512_load_si512(panel + j);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
          int32_t word;
          std::memcpy(&word, q + t * bs + 4 * j, 4);
          isum[t] = _mm512_dpbusd_epi32(isum[t], w, _mm512_set1_epi32(word));
        }
      }
    }
    const float* dx = x.dx + b * kCodeTile;
    const float* sx = x.sx + b * kCodeTile;
    epilogue_scaled(
        g0, g1, b, NT, [&](int t) { return isum[t]; }, [&](int t) { return dx[t]; }, [&](int t) { return sx[t]; }, acc);
  }
  for (int t = 0; t < NT; ++t) store_acc_pair(acc[t], out0, out1, t);
}

// panel_sweep for n <= NT tokens (fewer: the tile's last), the count as a template argument.
template <int BITS, int NT, int BS>
void panel_sweep_n(int n, const QGroup& g0, const QGroup& g1, const __m512i* panel, int b0, int b1, const Acts& x,
                   const int32_t* zsum, int kb, float* out0, float* out1) {
  if constexpr (NT > 0) {
    if (n == NT)
      panel_sweep<BITS, NT, BS>(g0, g1, panel, b0, b1, x, zsum, kb, out0, out1);
    else
      panel_sweep_n<BITS, NT - 1, BS>(n, g0, g1, panel, b0, b1, x, zsum, kb, out0, out1);
  }
}

// The panel is swept kPanelBytes of it at a time by all of the tile's tokens, so the part being read stays in L1
// (TinyLlama's down projection, K = 5632, has an 88 KB panel). Each output's float steps stay in block order.
constexpr int kPanelBytes = 16384;

template <int BITS, int BS>
void panel_gemm(const QGemmTile& t) {
  const QGroup &g0 = t.w0, &g1 = t.w1;
  const int kb = g0.kb, bs = g0.bs, subs = bs / 32;
  __m512i* panel = panel_vectors(static_cast<size_t>(kb) * subs * 8);
  stage_panel<BITS>(g0, g1, panel);
  const int step = kPanelBytes / (subs * 512) > 0 ? kPanelBytes / (subs * 512) : 1;  // blocks a chunk of the panel
  // While the panel is swept, the weights of the next pairs come into L2: the 2 groups after each of g0 and g1 (the
  // driver's next pair lies there, gated or not), codes and scales, spread over the sweeps (each one a
  // 1 / sweeps-th of the lines). Without it, staging waited on memory: 11% of the kernel's samples.
  const int64_t gbytes = static_cast<int64_t>(kb) * bs * BITS, lines = 2 * gbytes / 64;
  const int sweeps = ((kb + step - 1) / step) * ((t.nt + kPanelTokens - 1) / kPanelTokens);
  const int64_t per_sweep = lines / sweeps + 1;
  int64_t line = 0;
  for (int b0 = 0; b0 < kb; b0 += step) {
    const int b1 = b0 + step < kb ? b0 + step : kb;
    for (int i = 0; i < t.nt; i += kPanelTokens) {
      for (int64_t e = line + per_sweep; line < e && line < lines; ++line) {
        _mm_prefetch(reinterpret_cast<const char*>(g0.codes + gbytes) + 64 * line, _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(g1.codes + gbytes) + 64 * line, _MM_HINT_T1);
        if (line < kb / 2) {  // 4 blocks' d (and m) of a group a line: 2 groups' worth
          _mm_prefetch(reinterpret_cast<const char*>(g0.d + 8 * kb) + 64 * line, _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(g1.d + 8 * kb) + 64 * line, _MM_HINT_T1);
          if (g0.m) {
            _mm_prefetch(reinterpret_cast<const char*>(g0.m + 8 * kb) + 64 * line, _MM_HINT_T1);
            _mm_prefetch(reinterpret_cast<const char*>(g1.m + 8 * kb) + 64 * line, _MM_HINT_T1);
          }
        }
      }
      const QTokens tile = advance_tokens(t.x, i / kCodeTile * kCodeTile, kb);  // the tile holding token i
      const int row = i % kCodeTile;  // a sweep stays in its tile: kPanelTokens divides kCodeTile
      const int n = t.nt - i < kPanelTokens ? t.nt - i : kPanelTokens;
      const Acts x{tile.q_tiles + row * bs, tile.dx_tiles + row, tile.sx_tiles + row,
                   BITS == 8 ? tile.qsum_tiles + row : nullptr};
      const int32_t* zsum = t.x.zsum + static_cast<int64_t>(i) * kb;
      panel_sweep_n<BITS, kPanelTokens, BS>(n, g0, g1, panel, b0, b1, x, zsum, kb, t.out0 + 8 * i, t.out1 + 8 * i);
    }
  }
}

// QLinearIsa::gemm: paired int4 / int8 tiles of more than kQTile tokens, their codes by tiles, by the panel GEMM; the
// rest as the group dots (group_dot2 for kQTile tokens or fewer, AVX2's lookup kernels for mxfp4, AVX2's act_bits 16
// path).
void gemm(const QLinearIsa& isa, const QGemmTile& t) {
  if (!t.paired || t.act16 || t.w0.mxfp4 || t.nt <= kQTile || !t.x.q_tiles) {
    gemm_by_group_dots(isa, t);
  } else if (t.w0.bits == 4) {
    t.w0.bs == 32 ? panel_gemm<4, 32>(t) : panel_gemm<4, 0>(t);
  } else {
    t.w0.bs == 32 ? panel_gemm<8, 32>(t) : panel_gemm<8, 0>(t);
  }
}

// ---- the LoRA on int8 stacks (qlinear.h): the same integer sums and float steps as AVX2 and scalar.

// 16 ranks of one segment's A: a 512-bit vector of the shrink (fewer left: the rest masked off, never read).
struct RankVec {
  const int8_t* A;
  const uint16_t* sA;
  int lda, r0;
  __mmask16 mask;
  float* const* h;
};

// h[t][r0..r0+15] of V rank vectors (of one segment or several) for NT tokens, in one pass over the tokens' codes:
// each broadcast word of x feeds the V vectors' dpbusd, V x NT independent chains, and the V blocks of A stream
// side by side (three cold blocks read at once instead of one after the other). A's codes are biased to unsigned
// (a ^ 0x80 = a + 128, once per load for all tokens) for dpbusd; each chunk's accumulator is seeded with
// -128 * (the chunk's code sum), so it ends at the exact sum of a * x. Per lane the float steps are those of one
// vector alone: the same bits whatever V.
template <int NT, int V>
void shrink_vecs(const QLoraToken* x, int K, int bs, const RankVec* rv) {
  constexpr int kChains = NT * V == 1 ? 2 : 1;  // independent dpbusd chains per (token, vector)
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const int kc = (K + kLoraChunk - 1) / kLoraChunk;
  __m512 acc[NT][V];
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < V; ++v) acc[t][v] = _mm512_setzero_ps();
  for (int c = 0; c < kc; ++c) {
    __m512i isum[NT][V][kChains];
    for (int t = 0; t < NT; ++t)
      for (int v = 0; v < V; ++v) {
        isum[t][v][0] = _mm512_set1_epi32(-128 * x[t].qsum[c]);
        for (int k = 1; k < kChains; ++k) isum[t][v][k] = _mm512_setzero_si512();
      }
    const int w0 = c * kLoraChunk / 4, w1 = (K < (c + 1) * kLoraChunk ? K : (c + 1) * kLoraChunk) / 4;
    for (int w = w0; w < w1; ++w) {
      __m512i xw[NT];
      for (int t = 0; t < NT; ++t) {
        int32_t word;
        std::memcpy(&word, x[t].q + 4 * w, 4);
        xw[t] = _mm512_set1_epi32(word);
      }
      for (int v = 0; v < V; ++v) {
        const int8_t* quad = rv[v].A + (static_cast<int64_t>(w) * rv[v].lda + rv[v].r0) * 4;
        _mm_prefetch(reinterpret_cast<const char*>(quad) + kLoraPrefetchA, _MM_HINT_T0);  // never faults
        const __m512i a = _mm512_xor_si512(_mm512_maskz_loadu_epi32(rv[v].mask, quad), bias);
        for (int t = 0; t < NT; ++t) {
          __m512i& s = isum[t][v][(w - w0) % kChains];
          s = _mm512_dpbusd_epi32(s, a, xw[t]);
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const __m512 sa = _mm512_cvtph_ps(
          _mm256_maskz_loadu_epi16(rv[v].mask, rv[v].sA + static_cast<int64_t>(c) * rv[v].lda + rv[v].r0));
      for (int t = 0; t < NT; ++t) {
        __m512i s = isum[t][v][0];
        for (int k = 1; k < kChains; ++k) s = _mm512_add_epi32(s, isum[t][v][k]);
        const __m512 dsa = _mm512_mul_ps(_mm512_set1_ps(x[t].dx[c * kLoraChunk / bs]), sa);
        acc[t][v] = _mm512_fmadd_ps(dsa, _mm512_cvtepi32_ps(s), acc[t][v]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(rv[v].h[t] + rv[v].r0, rv[v].mask, acc[t][v]);
}

struct Shrink {
  using Vec = RankVec;
  static RankVec make(const QLoraShrink& s, int r0) {
    const int left = s.rank - r0;
    return {
        s.A, s.sA, s.lda, r0, left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1),
        s.h};
  }
  template <int NT, int V>
  static void pass(const QLoraToken* x, int K, int bs, const RankVec* v) {
    shrink_vecs<NT, V>(x, K, bs, v);
  }
};

void lora_shrink(const QLoraToken* x, int n, int K, int bs, const QLoraShrink* s, int ns) {
  lora_shrink_passes<Shrink, 16>(x, n, K, bs, s, ns);
}

// 16 columns a 512-bit vector (fewer left: the rest masked off, never read or written): per rank quad, 64 codes
// (4 ranks of 16 columns, one column a 32-bit lane) biased to unsigned (b ^ 0x80 = b + 128, once per load for all
// tokens) and one dpbusd per token with a broadcast word of its 4 h codes; each accumulator is seeded with
// -128 * (the token's h code sum), so it ends at the exact sum of qh * b.
template <int NT>
void expand_t(const int8_t* const* qh, const float* coef, int quads, const int8_t* B, int64_t width, const uint16_t* sB,
              float* const* out, int64_t ostride) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  int32_t seed[NT];
  for (int t = 0; t < NT; ++t) {
    int32_t s = 0;
    for (int r = 0; r < 4 * quads; ++r) s += qh[t][r];
    seed[t] = -128 * s;
  }
  for (int64_t i = 0; i < width; i += 16) {
    const int64_t left = width - i;
    const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
    __m512i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_set1_epi32(seed[t]);
    for (int p = 0; p < quads; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(B + (p * width + i + kLoraPrefetchB) * 4), _MM_HINT_T0);
      const __m512i b = _mm512_xor_si512(_mm512_maskz_loadu_epi32(mask, B + (p * width + i) * 4), bias);
      for (int t = 0; t < NT; ++t) {
        int32_t hw;
        std::memcpy(&hw, qh[t] + 4 * p, 4);
        isum[t] = _mm512_dpbusd_epi32(isum[t], b, _mm512_set1_epi32(hw));
      }
    }
    const __m512 sb = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, sB + i));
    for (int t = 0; t < NT; ++t) {  // columns i..i+7 and i+8..i+15: two 8-column rows of the output
      const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(coef[t]), sb), _mm512_cvtepi32_ps(isum[t]));
      float* o = out[t] + i / 8 * ostride;
      _mm256_mask_storeu_ps(o, static_cast<__mmask8>(mask), _mm512_castps512_ps256(v));
      if (left > 8)
        _mm256_mask_storeu_ps(o + ostride, static_cast<__mmask8>(mask >> 8),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    }
  }
}

void lora_expand(const int8_t* const* qh, const float* coef, int n, int quads, const int8_t* B, int64_t width,
                 const uint16_t* sB, float* const* out, int64_t ostride) {
  with_tokens(n, [&](auto nt) { expand_t<decltype(nt)::value>(qh, coef, quads, B, width, sB, out, ostride); });
}

}  // namespace
}  // namespace vnni
}  // namespace ortllm

#pragma GCC pop_options

namespace ortllm {
// Compiled for the baseline ISA: checks the CPU and hands out the table (AVX2's, with these dots).
const QLinearIsa* qlinear_vnni_isa() {
  static const QLinearIsa* isa = []() -> const QLinearIsa* {
    const QLinearIsa* avx2 = qlinear_avx2_isa();
    if (avx2 == nullptr || !cpu_has_avx512_vnni()) return nullptr;
    static QLinearIsa table = *avx2;  // AVX2's, with these dots
    table.name = "avx512vnni";
    table.group_dot = vnni::group_dot;
    table.group_dot2 = vnni::group_dot2;
    table.lora_shrink = vnni::lora_shrink;
    table.lora_expand = vnni::lora_expand;
    table.group_dot16 = vnni::group_dot16;
    table.group_dot2_16 = vnni::group_dot2_16;
    table.gemm = vnni::gemm;
    table.gemm_tokens = kGemmTokensMax;  // a work item's tokens: its panel swept 8 tokens at a time
    table.tiled_codes = true;
    // group_dot_mxfp4 / group_dot2_mxfp4 stay AVX2's (the table it copied): the mxfp4 lookup + maddubs kernels
    return &table;
  }();
  return isa;
}
}  // namespace ortllm
#else
namespace ortllm {
const QLinearIsa* qlinear_vnni_isa() {
  return nullptr;
}
}  // namespace ortllm
#endif
