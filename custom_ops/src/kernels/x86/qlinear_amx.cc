// AMX-INT8 QLinear kernel (Intel Sapphire Rapids and later): the gemm entry for paired tiles of up to
// kGemmTokensMax tokens (panel_gemm: two 8-row groups' weights staged once, swept by every 16 tokens of the tile) and
// group_dot2 for up to kDotTileMax tokens a call, the integer dots of two 8-row groups (16 output rows) on the tile
// unit; everything else is the AVX-512 VNNI table's.
//
// Per block b and per chunk of up to 64 of its elements (bs 32 or 64: one chunk; 128: two; 256: four):
//   A  tile [nt, kc]       int8   the tokens' activation codes: by tiles where the driver gives them (QTokens::q_tiles,
//                                 one run a block), else straight from the rows (row stride q_stride)
//   B  tile [kc / 4, 64]   int8   the 16 rows' weights, k-quad i of row r at bytes [4r, 4r + 4) of tile row i: int4
//                                 codes less their zero point (q - 8, in -8..7; unpacked from both groups' chunks),
//                                 int8 codes as they are (zero point 0); staged in L1, 64 bytes a tile row
//   C  tile [nt, 16]       int32  += A B (TDPBSSD: signed x signed, exact)
// C row t is then token t's isum over the block for the 16 rows (group 0's in lanes 0-7): sum (q_w - zp) q_x, the
// integer group_dot_t gets as sum q_w q_x - zp sum q_x. The float epilogue per block is group_dot2_t's (qlinear_
// vnni.cc): acc = fma(d * dx, float(isum), acc), then fma(m, sx, acc). So the same bits as every other table.
//
// Why: one tile multiply is 16 x 16 x 64 multiply-adds (~12 cycles here); AVX-512 VNNI's kernel needs a broadcast
// load per dpbusd. The float epilogue (per block, nt x (cvt, mul, fma, fma) on 16 lanes) is now the larger part:
// at bs 32 each multiply fills half the tile's depth and every 32 elements end in a float step.
//
// The tile unit needs the kernel's permission (arch_prctl ARCH_REQ_XCOMP_PERM, once a process) and a tile
// configuration per thread: each call loads its own (~50 ns, against >= 2 us of work a call), since another
// library's AMX code may load others on the same thread between calls; ORT's MLAS does the same the other way (its
// int8 GEMM compares the thread's current configuration with its own before each GEMM and reloads it).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../qlinear.h"
#include "isa_x86.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,amx-tile,amx-int8")
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ortllm {
namespace amx {
namespace {

#include "qlinear_pair.h"

static_assert(kDotTileMax == 16, "a C tile holds 16 tokens");

// The tile unit's configuration (palette 1), two sets of tiles so that one block's multiply overlaps the previous
// block's float epilogue (a tile is not renamed: reusing one waits for its store): set s is C tmm(3s) [nt x 16
// int32], A tmm(3s + 1) [nt x kc bytes], B tmm(3s + 2) [kc / 4 x 64 bytes].
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// ldtilecfg of cfg. GCC 12 does not see the instruction read the memory: inlined into a kernel, it dropped the
// stores of colsb before it (a fault: rows with 0 bytes a row). The empty asm takes cfg's address, so every store
// to it happens first.
inline void load_config(const TileConfig& cfg) {
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

void configure(int nt, int kc) {
  TileConfig cfg;
  for (int s = 0; s < 2; ++s) {
    cfg.rows[3 * s] = static_cast<uint8_t>(nt), cfg.colsb[3 * s] = 64;
    cfg.rows[3 * s + 1] = static_cast<uint8_t>(nt), cfg.colsb[3 * s + 1] = static_cast<uint16_t>(kc);
    cfg.rows[3 * s + 2] = static_cast<uint8_t>(kc / 4), cfg.colsb[3 * s + 2] = 64;
  }
  load_config(cfg);
}

// The B tile rows of one sub-block of 32 elements (8 k-quads) of both groups, into rows[0..7] (64 bytes each).
template <int BITS>
inline void stage(const uint8_t* c0, const uint8_t* c1, __m512i* rows) {
  if (BITS == 4) {  // chunk j: low nibbles k-quad 2j, high nibbles k-quad 2j + 1 (qlinear.h), less the zero point
    const __m512i low = _mm512_set1_epi8(0x0F), zp = _mm512_set1_epi8(8);
    for (int j = 0; j < 4; ++j) {
      const __m512i w = load_pair(c0 + 32 * j, c1 + 32 * j);
      _mm512_store_si512(rows + 2 * j, _mm512_sub_epi8(_mm512_and_si512(w, low), zp));
      _mm512_store_si512(rows + 2 * j + 1, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(w, 4), low), zp));
    }
  } else {  // chunk i: k-quad i
    for (int i = 0; i < 8; ++i) _mm512_store_si512(rows + i, load_pair(c0 + 32 * i, c1 + 32 * i));
  }
}

// The B tile rows of block b of both groups (bs / 32 sub-blocks, 8 k-quads each) into rows[0 .. bs / 4).
template <int BITS>
inline void stage_block(const QGroup& g0, const QGroup& g1, int b, __m512i* rows) {
  constexpr int kSubBytes = 32 * BITS;  // one group's bytes per sub-block
  const int subs = g0.bs / 32;
  const int64_t at = static_cast<int64_t>(b) * subs * kSubBytes;
  for (int s = 0; s < subs; ++s)
    stage<BITS>(g0.codes + at + s * kSubBytes, g1.codes + at + s * kSubBytes, rows + 8 * s);
}

// Where a pass reads block b's operands: B from `panel` (every block's rows staged up front, bs / 4 rows a block) or,
// without one, staged a block ahead into a double buffer; A at a + b * a_block (+ k within the block), its rows
// a_stride bytes apart: the tokens' rows (a_block bs, a_stride q_stride: kCodeTile rows a K-row apart) or their codes
// by tiles (QTokens::q_tiles: a_block kCodeTile * bs, a_stride bs, one run a block).
struct Operands {
  const __m512i* panel;
  const int8_t* a;
  int64_t a_block;
  int64_t a_stride;
};

Operands operands(const QTokens& x, int bs, const __m512i* panel) {
  if (x.q_tiles) return {panel, x.q_tiles, static_cast<int64_t>(kCodeTile) * bs, bs};
  return {panel, x.q, bs, x.q_stride};
}

// Block b's integer sums for the pass's tokens on tile set S (its C tile zeroed, then one multiply per chunk of the
// block), from its B rows. The tile intrinsics take their tile numbers as literals.
template <int S>
inline void block_sums(const Operands& o, int bs, int b, const __m512i* rows) {
  const int kc = bs < 64 ? bs : 64;
  const int8_t* a = o.a + b * o.a_block;
  if constexpr (S == 0) {
    _tile_zero(0);
    for (int k = 0; k < bs; k += kc) {
      _tile_loadd(2, rows + k / 4, 64);
      _tile_loadd(1, a + k, o.a_stride);
      _tile_dpbssd(0, 1, 2);
    }
  } else {
    _tile_zero(3);
    for (int k = 0; k < bs; k += kc) {
      _tile_loadd(5, rows + k / 4, 64);
      _tile_loadd(4, a + k, o.a_stride);
      _tile_dpbssd(3, 4, 5);
    }
  }
}

// C of set S into c [nt][16] (C row t: token t's 16 rows, group 0's in lanes 0-7).
template <int S>
inline void store_sums(int32_t* c) {
  if constexpr (S == 0) {
    _tile_stored(0, c, 64);
  } else {
    _tile_stored(3, c, 64);
  }
}

// Software-pipelined: in iteration b, block b's multiply, block b - 1's sums stored, block b + 1's B rows staged (no
// panel) and block b - kLag's float epilogue. Each store is read an iteration later or more: neither a vector store
// read by a tile load nor a tile store read by vector loads is forwarded, and a tile store waits for its multiply.
// With stage / load / multiply / store / epilogue in a row this ran no faster than VNNI's kernel (TinyLlama's gate|up
// at 512 tokens, 2 threads: 55 vs 52 ms); pipelined, 45 ms; the epilogue 3 or 4 blocks behind, no faster than 2.
constexpr int kLag = 2;  // blocks between a block's multiply and its epilogue

// One pass over K for up to kDotTileMax tokens (the tile configuration loaded for them). NTC: the tokens as a
// constant (kDotTileMax: the accumulators stay in registers), or 0 for nt. TILED: x's codes and scales by tiles.
template <int BITS, int NTC, bool TILED>
__attribute__((flatten)) void tile_pass(const QGroup& g0, const QGroup& g1, const QTokens& x, const Operands& o, int nt,
                                        float* out0, float* out1) {
  alignas(64) __m512i rows[2][kQLinearMaxBlock / 4];  // without a panel: B of blocks b and b + 1 (bs / 4 rows)
  alignas(64) int32_t c[kLag + 1][kDotTileMax][16];   // sums of the blocks in flight
  const int kb = g0.kb, bs = g0.bs, n = NTC > 0 ? NTC : nt;
  const auto b_rows = [&](int b) { return o.panel ? o.panel + static_cast<int64_t>(b) * (bs / 4) : rows[b & 1]; };
  __m512 acc[kDotTileMax];
#pragma GCC unroll 16
  for (int t = 0; t < n; ++t)  // 0 or the LoRA terms (qlinear.h)
    acc[t] = load_acc_pair(out0, out1, t);
  const auto epilogue = [&](int b) {
    const int32_t(*cb)[16] = c[b % (kLag + 1)];
    const auto isum = [&](int t) { return _mm512_load_si512(cb[t]); };
    if constexpr (TILED)
      epilogue_pair_tiles(g0, g1, x, b, n, isum, acc);
    else
      epilogue_pair(g0, g1, x, b, n, isum, acc);
  };
  if (!o.panel) stage_block<BITS>(g0, g1, 0, rows[0]);
  for (int b = 0; b < kb + kLag; ++b) {
    if (b < kb) {
      if (b & 1)
        block_sums<1>(o, bs, b, b_rows(b));
      else
        block_sums<0>(o, bs, b, b_rows(b));
    }
    if (b >= 1 && b <= kb) {
      if ((b - 1) & 1)
        store_sums<1>(&c[(b - 1) % (kLag + 1)][0][0]);
      else
        store_sums<0>(&c[(b - 1) % (kLag + 1)][0][0]);
    }
    if (!o.panel && b + 1 < kb) stage_block<BITS>(g0, g1, b + 1, rows[(b + 1) & 1]);
    if (b >= kLag) epilogue(b - kLag);
  }
#pragma GCC unroll 16
  for (int t = 0; t < n; ++t) store_acc_pair(acc[t], out0, out1, t);
}

// tile_pass with its constants: a full tile's tokens, and whether x comes by tiles.
template <int BITS>
void pass(const QGroup& g0, const QGroup& g1, const QTokens& x, const Operands& o, int nt, float* out0, float* out1) {
  if (nt == kDotTileMax && x.q_tiles)
    tile_pass<BITS, kDotTileMax, true>(g0, g1, x, o, nt, out0, out1);
  else if (nt == kDotTileMax)
    tile_pass<BITS, kDotTileMax, false>(g0, g1, x, o, nt, out0, out1);
  else if (x.q_tiles)
    tile_pass<BITS, 0, true>(g0, g1, x, o, nt, out0, out1);
  else
    tile_pass<BITS, 0, false>(g0, g1, x, o, nt, out0, out1);
}

template <int BITS>
void dot2_tile(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0, float* out1) {
  configure(nt, g0.bs < 64 ? g0.bs : 64);
  const Operands o = operands(x, g0.bs, nullptr);
  pass<BITS>(g0, g1, x, o, nt, out0, out1);
}

void group_dot2(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0, float* out1) {
  if (g0.bits == 4) {
    dot2_tile<4>(g0, g1, x, nt, out0, out1);
  } else {
    dot2_tile<8>(g0, g1, x, nt, out0, out1);
  }
}

// ---- act_bits 16 (int8 weights, int16 activation codes): each code split into a signed high and an unsigned low
// byte (QTokens::q16_hi / q16_lo, q = 256 hi + lo), two tile multiplies a chunk: C_hi += hi w (TDPBSSD), C_lo += lo w
// (TDPBUSD); isum = 256 C_hi + C_lo, exact (|isum| < 2^31 for bs <= 128, qlinear.h), group_dot16_t's integer. One
// set of tiles: C_hi tmm0, C_lo tmm1, A tmm2 (hi) / tmm3 (lo), B tmm4; the next block's multiplies wait for the
// previous block's store (no tile is renamed), its epilogue still two blocks behind as dot2_tile's.

void configure16(int nt, int kc) {
  TileConfig cfg;
  for (int i = 0; i < 4; ++i) {
    cfg.rows[i] = static_cast<uint8_t>(nt);
    cfg.colsb[i] = static_cast<uint16_t>(i < 2 ? 64 : kc);
  }
  cfg.rows[4] = static_cast<uint8_t>(kc / 4), cfg.colsb[4] = 64;
  load_config(cfg);
}

// One pass over K for nt <= kDotTileMax tokens (configure16 loaded for them): B from `panel` (every block's rows
// staged up front, as panel_gemm's) or, without one, staged a block ahead into a double buffer.
void tile_pass16(const QGroup& g0, const QGroup& g1, const QTokens& x, const __m512i* panel, int nt, float* out0,
                 float* out1) {
  alignas(64) __m512i rows[2][kQLinearMaxBlock16 / 4];  // B of blocks b and b + 1
  alignas(64) int32_t c[kLag + 1][2][kDotTileMax][16];  // [block][hi, lo][token][row]
  const int kb = g0.kb, bs = g0.bs, kc = bs < 64 ? bs : 64;
  const auto b_rows = [&](int b) { return panel ? panel + static_cast<int64_t>(b) * (bs / 4) : rows[b & 1]; };
  __m512 acc[kDotTileMax];
  for (int t = 0; t < nt; ++t) acc[t] = load_acc_pair(out0, out1, t);  // 0 or the LoRA terms (qlinear.h)
  const auto epilogue = [&](int b) {  // int8 weights: zero point 0, so 256 C_hi + C_lo is the isum itself
    const int32_t(*hi)[16] = c[b % (kLag + 1)][0];
    const int32_t(*lo)[16] = c[b % (kLag + 1)][1];
    const auto isum = [&](int t) {
      return _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi[t]), 8), _mm512_load_si512(lo[t]));
    };
    epilogue_pair(g0, g1, x, b, nt, isum, acc);
  };
  if (!panel) stage_block<8>(g0, g1, 0, rows[0]);
  for (int b = 0; b < kb + kLag; ++b) {
    if (b < kb) {
      _tile_zero(0);
      _tile_zero(1);
      for (int k = 0; k < bs; k += kc) {
        _tile_loadd(4, b_rows(b) + k / 4, 64);
        _tile_loadd(2, x.q16_hi + b * bs + k, x.q_stride);
        _tile_loadd(3, x.q16_lo + b * bs + k, x.q_stride);
        _tile_dpbssd(0, 2, 4);
        _tile_dpbusd(1, 3, 4);
      }
      _tile_stored(0, &c[b % (kLag + 1)][0][0][0], 64);
      _tile_stored(1, &c[b % (kLag + 1)][1][0][0], 64);
    }
    if (!panel && b + 1 < kb) stage_block<8>(g0, g1, b + 1, rows[(b + 1) & 1]);
    if (b >= kLag) epilogue(b - kLag);
  }
  for (int t = 0; t < nt; ++t) store_acc_pair(acc[t], out0, out1, t);
}

void dot2_tile16(const QGroup& g0, const QGroup& g1, const QTokens& x, int nt, float* out0, float* out1) {
  configure16(nt, g0.bs < 64 ? g0.bs : 64);
  tile_pass16(g0, g1, x, nullptr, nt, out0, out1);
}

// The panel GEMM: a paired tile of up to kGemmTokensMax tokens (a work item's token chunk). Both groups' weights are
// staged once for all of K (kb * bs / 4 rows of 64 bytes: 16 x K bytes, 32 KB at K = 2048, in L1 / L2) and swept by
// every kDotTileMax tokens of the tile, instead of staged again for each (a 512-token prefill staged each weight 32
// times, once per 16 tokens). Each pass is tile_pass's (ACT16: tile_pass16's): the same sums and float steps, so the
// same bits.
template <int BITS, bool ACT16 = false>
void panel_gemm(const QGemmTile& t) {
  const QGroup &g0 = t.w0, &g1 = t.w1;
  const int kb = g0.kb, bs = g0.bs, kc = bs < 64 ? bs : 64;
  __m512i* panel = panel_vectors(static_cast<size_t>(kb) * (bs / 4));  // B rows
  for (int b = 0; b < kb; ++b) stage_block<BITS>(g0, g1, b, panel + static_cast<int64_t>(b) * (bs / 4));
  int configured = 0;
  for (int i = 0; i < t.nt; i += kDotTileMax) {
    const int ni = t.nt - i < kDotTileMax ? t.nt - i : kDotTileMax;
    const QTokens x = advance_tokens(t.x, i, kb);
    if constexpr (ACT16) {  // int8 weights on int16 codes: tile_pass16's passes (before, each 16 tokens staged again)
      if (ni != configured) configure16(ni, kc), configured = ni;
      tile_pass16(g0, g1, x, panel, ni, t.out0 + 8 * i, t.out1 + 8 * i);
    } else {
      if (ni != configured) configure(ni, kc), configured = ni;
      pass<BITS>(g0, g1, x, operands(x, bs, panel), ni, t.out0 + 8 * i, t.out1 + 8 * i);
    }
  }
}

// QLinearIsa::gemm: paired int4 / int8 tiles of more than one C tile of tokens by the panel GEMMs (act_bits 16's
// too); the rest as the group dots (group_dot2 / dot2_tile16 on the tiles for 16 tokens or fewer, AVX2's lookup
// kernels for mxfp4).
void gemm(const QLinearIsa& isa, const QGemmTile& t) {
  if (!t.paired || t.w0.mxfp4 || t.nt <= kDotTileMax) {
    gemm_by_group_dots(isa, t);
  } else if (t.act16) {
    panel_gemm<8, true>(t);
  } else if (t.w0.bits == 4) {
    panel_gemm<4>(t);
  } else {
    panel_gemm<8>(t);
  }
}

// CPUID.(EAX = 7, ECX = 0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), and the kernel's permission to use the
// tile data state (Linux >= 5.16; refused elsewhere: then no AMX).
bool amx_usable() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx >> 24 & 1u) || !(edx >> 25 & 1u)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace
}  // namespace amx
}  // namespace ortllm

#pragma GCC pop_options

namespace ortllm {
const QLinearIsa* qlinear_amx_isa() {
  static const QLinearIsa* isa = []() -> const QLinearIsa* {
    const QLinearIsa* vnni = qlinear_vnni_isa();
    if (vnni == nullptr || !amx::amx_usable()) return nullptr;
    static QLinearIsa table = *vnni;
    table.name = "amx";
    table.group_dot2 = amx::group_dot2;
    table.dot2_tokens = kDotTileMax;
    table.gemm = amx::gemm;
    table.gemm_tokens = kGemmTokensMax;  // a work item's tokens (32: 0.89x, 128 with items of 128: 0.85x)
    table.tiled_codes = true;
    table.group_dot2_16 = amx::dot2_tile16;
    // mxfp4 groups take AVX2's group_dot_mxfp4 / group_dot2_mxfp4 (copied with VNNI's table), not the tiles
    return &table;
  }();
  return isa;
}
}  // namespace ortllm
#else
namespace ortllm {
const QLinearIsa* qlinear_amx_isa() {
  return nullptr;
}
}  // namespace ortllm
#endif
