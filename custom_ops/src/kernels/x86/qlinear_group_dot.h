// The QLinear group micro-kernel's outer loop, shared by the AVX2 and the AVX-512 VNNI translation
// units. Include it only inside an anonymous namespace of such a unit, after its
// `#pragma GCC target(...)` and every system header: each unit then compiles its own internal copy
// for its own ISA (an inline function with external linkage could be merged across units by the
// linker, and an AVX2-only machine would run the AVX-512 copy). The unit includes stream_prefetch.h first.
//
// Each unit defines a `struct Dots` with
//   template <int NT, int BITS> static const uint8_t* block(const uint8_t* codes, int sub_blocks,
//                                                            const int8_t* const* qs, const int32_t* zs,
//                                                            __m256i* isum);
// which sets isum[t] (t < NT) to the 8 rows' exact integer dots with token t over one block of
// `sub_blocks` sub-blocks of 32 codes, minus zs[t] (the token's zero-point term zp * sum(x), which seeds
// the accumulators), and returns the codes past the block, and its group_dot as
// group_dot_any<Dots>. Integer sums are exact in
// any order, so every ISA gives the same isum; the float epilogue below is one sequence of operations
// per output, the same in every unit and for every NT: the same bits whatever the ISA or the batch.

// f(std::integral_constant<int, n>{}) for n = 1..kQTile: a token count as a template argument of the kernels.
template <class F>
void with_tokens(int n, F&& f) {
  switch (n) {
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 3:
      f(std::integral_constant<int, 3>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    default:
      f(std::integral_constant<int, 1>{});
      break;
  }
}

// The LoRA shrink of a quad's segments (qlinear.h, lora_shrink) in passes of up to kShrinkVecs rank vectors of
// kLanes ranks each, taken over the segments' ranks in order (q's, then k's, then v's): the vectors of one pass read
// their blocks of A side by side. Each unit defines a `struct Shrink` with
//   using Vec = ...;                                  one rank vector: its segment's A, scales, rows and ranks
//   static Vec make(const QLoraShrink& s, int r0);    ranks r0 .. r0 + kLanes - 1 of segment s (fewer left)
//   template <int NT, int V> static void pass(const QLoraToken* x, int K, int bs, const Vec* v);
constexpr int kShrinkVecs = 3;  // VNNI at NT = 4: 12 accumulators + 12 sums in its 32 registers (AVX2: the same bound)
static_assert(kShrinkVecs == 3, "lora_shrink_passes's flush instantiates passes of 1 to 3 vectors");

template <class Shrink, int kLanes>
void lora_shrink_passes(const QLoraToken* x, int n, int K, int bs, const QLoraShrink* s, int ns) {
  with_tokens(n, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    typename Shrink::Vec v[kShrinkVecs];
    int nv = 0;
    const auto flush = [&] {
      if (nv == 3) Shrink::template pass<NT, 3>(x, K, bs, v);
      if (nv == 2) Shrink::template pass<NT, 2>(x, K, bs, v);
      if (nv == 1) Shrink::template pass<NT, 1>(x, K, bs, v);
      nv = 0;
    };
    for (int j = 0; j < ns; ++j)
      for (int r = 0; r < s[j].rank; r += kLanes) {
        v[nv++] = Shrink::make(s[j], r);
        if (nv == kShrinkVecs) flush();
      }
    flush();
  });
}

inline __m256i bcast_word(const int8_t* p) {
  int32_t w;
  std::memcpy(&w, p, 4);
  return _mm256_set1_epi32(w);
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 8 rows' int4 codes of one sub-block (128 bytes) as 8 vectors of 32 unsigned bytes: vector 2j
// holds, in each 32-bit lane (one row), the codes of elements 8j..8j+3, vector 2j + 1 those of 8j+4..8j+7.
inline void unpack4(const uint8_t* sub, __m256i* v) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 32 * j));
    v[2 * j] = _mm256_and_si256(w, low);
    v[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
  }
}

template <class Dots, int NT, int BITS>
void group_dot_t(const QGroup& g, const QTokens& x, float* out) {
  const int sub_blocks = g.bs / 32;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_loadu_ps(out + 8 * t);  // 0 or the LoRA term (qlinear.h)
  const uint8_t* codes = g.codes;
  const bool t0 = NT == 1 && stream_prefetch_t0();  // NTA on AMD, T0 on Intel (stream_prefetch.h)
  for (int b = 0; b < g.kb; ++b) {
    if (NT == 1) {  // decode: each weight byte is read once per step. A non-temporal prefetch keeps the stream
      // from evicting what the rest of the step reuses (activations, KV, the engine's own Python): B = 1 decode
      // 204 -> 235 tok/s at 512 bytes ahead (medians of 3, alternating). With the scales and offsets below
      // prefetched too, 1536 bytes ahead (12 int4 blocks) keeps more of each thread's stream in flight: B = 1
      // decode 301.0 -> 386.4 tok/s (medians of 4, alternating with 512 and 2048: 376.7), context 2048
      // 232.4 / 240.1 / 233.9 -> 258.5 / 270.0 / 288.5 (2048 ahead). Prefetches never fault, past the end included.
      for (int l = 0; l < g.bs * BITS; l += 64) prefetch_stream(codes + 1536 + l, t0);
      // The scales and offsets are the same kind of stream (16 bytes a block each, a fifth of int4's bytes; a
      // line holds 4 blocks): without this they still went through L2 and evicted the rest. 8 blocks ahead,
      // once per 4 blocks (the groups lie back to back, so the lines past a group's end are the next one's):
      // B = 1 decode 291.6 -> 321.5 tok/s (medians of 8 runs, alternating; faster in 8 of 8).
      if ((b & 3) == 0) {
        prefetch_stream(g.d + (b + 8) * 8, t0);
        if (g.m) prefetch_stream(g.m + (b + 8) * 8, t0);
      }
    }
    __m256i isum[NT];
    const int8_t* qs[NT];
    int32_t zs[NT];
    for (int t = 0; t < NT; ++t) qs[t] = x.q + t * x.q_stride + b * g.bs, zs[t] = x.zsum[t * g.kb + b];
    codes = Dots::template block<NT, BITS>(codes, sub_blocks, qs, zs, isum);
    const __m256 d = load_f16x8(g.d + b * 8);
    for (int t = 0; t < NT; ++t) {
      const int tb = t * g.kb + b;
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x.dx[tb])), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    if (g.m) {
      const __m256 m = load_f16x8(g.m + b * 8);
      for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(x.sx[t * g.kb + b]), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out + 8 * t, acc[t]);
}

template <class Dots, int BITS>
void group_dot_bits(const QGroup& g, const QTokens& x, int nt, float* out) {
  switch (nt) {
    case 4:
      group_dot_t<Dots, 4, BITS>(g, x, out);
      break;
    case 3:
      group_dot_t<Dots, 3, BITS>(g, x, out);
      break;
    case 2:
      group_dot_t<Dots, 2, BITS>(g, x, out);
      break;
    default:
      group_dot_t<Dots, 1, BITS>(g, x, out);
      break;
  }
}

template <class Dots>
void group_dot_any(const QGroup& g, const QTokens& x, int nt, float* out) {
  if (g.bits == 4) {
    group_dot_bits<Dots, 4>(g, x, nt, out);
  } else {
    group_dot_bits<Dots, 8>(g, x, nt, out);
  }
}

// act_bits 16 (int8 weights, int16 activation codes). Each unit defines a `struct Dots16` with
//   template <int NT> static void block(const uint8_t* codes, int sub_blocks, const int16_t* const* qs,
//                                       __m256i* lo, __m256i* hi);
// which sets lo[t] / hi[t] to rows 0-3 / 4-7's two partial sums each (lanes 2r, 2r + 1: elements 4i, 4i + 1 and
// 4i + 2, 4i + 3 of every chunk i) of token t's exact integer dot over one block: per 32-byte chunk of 8 rows x 4
// codes, the codes widened to int16 (rows 0-3, rows 4-7) against the token's 4 codes broadcast to every 64-bit
// lane. Here hadd pairs them, one permute puts the rows in lane order, then group_dot_t's float epilogue.
template <class Dots16, int NT>
void group_dot16_t(const QGroup& g, const QTokens& x, float* out) {
  const int sub_blocks = g.bs / 32;
  const __m256i rows = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);  // hadd's lanes (r0 r1 r4 r5 | r2 r3 r6 r7)
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_loadu_ps(out + 8 * t);
  const uint8_t* codes = g.codes;
  const bool t0 = NT == 1 && stream_prefetch_t0();
  for (int b = 0; b < g.kb; ++b, codes += sub_blocks * 256) {
    if (NT == 1) {  // decode: the weights stream once a step, as in group_dot_t
      for (int l = 0; l < g.bs * 8; l += 64) prefetch_stream(codes + 1536 + l, t0);
      if ((b & 3) == 0) prefetch_stream(g.d + (b + 8) * 8, t0);
    }
    const int16_t* qs[NT];
    for (int t = 0; t < NT; ++t) qs[t] = x.q16 + t * x.q_stride + b * g.bs;
    __m256i lo[NT], hi[NT];
    Dots16::template block<NT>(codes, sub_blocks, qs, lo, hi);
    const __m256 d = load_f16x8(g.d + b * 8);
    for (int t = 0; t < NT; ++t) {
      const int tb = t * g.kb + b;
      const __m256i isum = _mm256_sub_epi32(_mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo[t], hi[t]), rows),
                                            _mm256_set1_epi32(x.zsum[tb]));
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x.dx[tb])), _mm256_cvtepi32_ps(isum), acc[t]);
    }
    if (g.m) {
      const __m256 m = load_f16x8(g.m + b * 8);
      for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(x.sx[t * g.kb + b]), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out + 8 * t, acc[t]);
}

template <class Dots16>
void group_dot16_any(const QGroup& g, const QTokens& x, int nt, float* out) {
  with_tokens(nt, [&](auto n) { group_dot16_t<Dots16, decltype(n)::value>(g, x, out); });
}

// The 8 rows' int8 codes of chunk i of a sub-block widened to int16: rows 0-3 in *lo, rows 4-7 in *hi.
inline void widen8(const uint8_t* chunk, __m256i* lo, __m256i* hi) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk));
  *lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
  *hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
}

// A token's 4 int16 codes at p in every 64-bit lane.
inline __m256i bcast_quad16(const int16_t* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm256_set1_epi64x(v);
}
