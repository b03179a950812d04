// The tiles' vectors (gguf_tiles.cpp, gguf_ktiles.cpp): a tile is 16 output columns, one
// 32-bit lane each, with 4 codes of a column per lane; AVX-512 holds a whole tile in a vector,
// AVX2 half of one (a "slice"). Included only where the int8 kernel builds (RADIXRT_TILES).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "gguf_dot8.h"
#include "gguf_layout.h"

namespace radixrt::gguf {

// Input rows per pass over a tile's blocks: their sums stay in registers (32 of them with
// AVX-512's encoding, 16 without).
#ifdef __AVX512F__
constexpr int kTileRows = 8;
#else
constexpr int kTileRows = 4;
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
// AVX-512: a vector holds all 16 columns of a tile.
constexpr int kVectorColumns = 16;
using VecI = __m512i;
using VecF = __m512;
inline VecI load_codes(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline VecI splat_word(int32_t w) { return _mm512_set1_epi32(w); }
inline VecF splat(float f) { return _mm512_set1_ps(f); }
inline VecF scales16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VecI low_nibbles(VecI v) { return _mm512_and_si512(v, _mm512_set1_epi8(0xF)); }
inline VecI high_nibbles(VecI v) { return low_nibbles(_mm512_srli_epi16(v, 4)); }
inline VecI dot4(VecI sum, VecI codes, VecI x) {
#ifdef __AVX512VNNI__
  return _mm512_dpbusd_epi32(sum, codes, x);
#else
  return _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(codes, x), _mm512_set1_epi16(1)));
#endif
}
// Q8_0: |q| times x with q's sign (AVX-512 has no byte sign instruction: x negated by mask).
struct Signs {
  __mmask64 negative[8];
};
inline VecI absolute(VecI q, Signs& s, int v) {
  s.negative[v] = _mm512_movepi8_mask(q);
  return _mm512_abs_epi8(q);
}
inline VecI signed_x(VecI x, const Signs& s, int v) {
  return _mm512_mask_sub_epi8(x, s.negative[v], _mm512_setzero_si512(), x);
}
inline void store_columns(VecF acc, float* out) { _mm512_storeu_ps(out, acc); }
inline VecI zero_i() { return _mm512_setzero_si512(); }
inline VecF zero_f() { return _mm512_setzero_ps(); }
inline VecF to_float(VecI v) { return _mm512_cvtepi32_ps(v); }
inline VecF fma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
#else
// AVX2: a vector holds 8 columns, a tile's half.
constexpr int kVectorColumns = 8;
using VecI = __m256i;
using VecF = __m256;
inline VecI load_codes(const uint8_t* p) { return load32(p); }
inline VecI splat_word(int32_t w) { return _mm256_set1_epi32(w); }
inline VecF splat(float f) { return _mm256_set1_ps(f); }
inline VecF scales16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VecI low_nibbles(VecI v) { return _mm256_and_si256(v, _mm256_set1_epi8(0xF)); }
inline VecI high_nibbles(VecI v) { return low_nibbles(_mm256_srli_epi16(v, 4)); }
// Exact either way: no pair of products passes int16 (15 * 127 or 128 * 127, twice).
inline VecI dot4(VecI sum, VecI codes, VecI x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(sum, codes, x);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(sum, codes, x);
#else
  return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), _mm256_set1_epi16(1)));
#endif
}
#if !defined(__AVXVNNI__) && !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
// Without VNNI, dot4 is three instructions. Where the codes are small, the int16 pair sums of
// several code vectors are added as int16 first and widened once (maddubs, add: two), the way
// llama.cpp's AVX2 Q4 dot does; the integers are the same, so are the bits.
#define RADIXRT_INT16_RUNS 1
inline VecI pair_sums(VecI codes, VecI x) { return _mm256_maddubs_epi16(codes, x); }
inline VecI add16(VecI a, VecI b) { return _mm256_add_epi16(a, b); }
inline VecI widen_pairs(VecI sum, VecI pairs) {
  return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif
struct Signs {
  __m256i q[8];
};
inline VecI absolute(VecI q, Signs& s, int v) {
  s.q[v] = q;
  return _mm256_abs_epi8(q);
}
inline VecI signed_x(VecI x, const Signs& s, int v) { return _mm256_sign_epi8(x, s.q[v]); }
inline void store_columns(VecF acc, float* out) { _mm256_storeu_ps(out, acc); }
inline VecI zero_i() { return _mm256_setzero_si256(); }
inline VecF zero_f() { return _mm256_setzero_ps(); }
inline VecF to_float(VecI v) { return _mm256_cvtepi32_ps(v); }
inline VecF fma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
#endif
constexpr int kSlices = kTileColumns / kVectorColumns;  // vectors across a tile

// The K-quant tiles' integer steps: one int8 per column widened to its lane (scales), two
// per column widened to int16 pairs (minimums), 32-bit products, and two int16 products
// added into each lane (VNNI's dpwssd where the CPU has it, else madd then add: the same
// exact integers).
#if defined(__AVX512F__) && defined(__AVX512BW__)
inline VecI widen_i8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VecI widen_i8_pairs(const uint8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VecI add_i(VecI a, VecI b) { return _mm512_add_epi32(a, b); }
inline VecI mul_i(VecI a, VecI b) { return _mm512_mullo_epi32(a, b); }
inline VecI and_bytes(VecI v, int8_t mask) { return _mm512_and_si512(v, _mm512_set1_epi8(mask)); }
inline VecI or_i(VecI a, VecI b) { return _mm512_or_si512(a, b); }
template <int S> inline VecI shift16(VecI v) {  // left by S, right by -S
  if constexpr (S >= 0) return _mm512_slli_epi16(v, S);
  else return _mm512_srli_epi16(v, -S);
}
inline VecI dot2(VecI sum, VecI a, VecI b) {
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(sum, a, b);
#else
  return _mm512_add_epi32(sum, _mm512_madd_epi16(a, b));
#endif
}
inline VecF fnma(VecF a, VecF b, VecF c) { return _mm512_fnmadd_ps(a, b, c); }
#else
inline VecI widen_i8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VecI widen_i8_pairs(const uint8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VecI add_i(VecI a, VecI b) { return _mm256_add_epi32(a, b); }
inline VecI mul_i(VecI a, VecI b) { return _mm256_mullo_epi32(a, b); }
inline VecI and_bytes(VecI v, int8_t mask) { return _mm256_and_si256(v, _mm256_set1_epi8(mask)); }
inline VecI or_i(VecI a, VecI b) { return _mm256_or_si256(a, b); }
template <int S> inline VecI shift16(VecI v) {
  if constexpr (S >= 0) return _mm256_slli_epi16(v, S);
  else return _mm256_srli_epi16(v, -S);
}
inline VecI dot2(VecI sum, VecI a, VecI b) { return add_scaled(sum, a, b); }
inline VecF fnma(VecF a, VecF b, VecF c) { return _mm256_fnmadd_ps(a, b, c); }
#endif

// Code vectors 0-7 (codes 4v .. 4v + 3 of each column) of 32 inputs from 4 vectors of
// nibbles at `at` (byte 4c + i of vector u: code 4u + i low, code 16 + 4u + i high), then kH
// vectors of their high bits (byte 4c + i of vector w: those of code 4v + i at bit kH k,
// v = w 8 / kH + k) put above the nibbles: Q5_0, Q5_1 and Q5_K take 1, Q6_K 2.
template <int kH>
inline void load_nibble_codes(const uint8_t* at, VecI codes[8]) {
  for (int u = 0; u < 4; ++u) {
    const VecI both = load_codes(at + 64 * u);
    codes[u] = low_nibbles(both);
    codes[u + 4] = high_nibbles(both);
  }
  if constexpr (kH > 0) {
    constexpr int kPer = 8 / kH;
    constexpr auto kMask = static_cast<int8_t>(((1 << kH) - 1) << 4);
    VecI high[kH];
    for (int w = 0; w < kH; ++w) high[w] = load_codes(at + 256 + 64 * w);
    [&]<int... V>(std::integer_sequence<int, V...>) {
      ((codes[V] = or_i(codes[V], and_bytes(shift16<4 - kH * (V % kPer)>(high[V / kPer]), kMask))), ...);
    }(std::make_integer_sequence<int, 8>{});
  }
}

// f.template operator()<T>() for the one T among Types that is `type`.
template <int64_t... Types, typename F>
void with_type(int64_t type, F&& f) {
  (void)((type == Types && (f.template operator()<Types>(), true)) || ...);
}

// Part-local columns [lo, hi) of a tiled part (tiles of `tile_bytes`) for the M rows of x
// into y's rows (ldy floats apart), a slice of a tile at a time through every pass of up to
// kTileRows rows: slice.template operator()<R>(r0, tile, h, acc) leaves rows r0 .. r0 + R's
// sums of slice h in acc.
template <typename Slice>
void tile_columns(const Part& p, int64_t lo, int64_t hi, int64_t M, float* y, int64_t ldy,
                  int64_t tile_bytes, Slice&& slice) {
  for (int64_t t = lo / kTileColumns; t * kTileColumns < hi; ++t) {
    const uint8_t* tile = p.tiles + t * tile_bytes;
    for (int h = 0; h < kSlices; ++h) {
      const int64_t c0 = t * kTileColumns + kVectorColumns * h;
      const int64_t from = std::max(lo, c0), to = std::min(hi, c0 + kVectorColumns);
      if (from >= to) continue;
      for (int64_t r0 = 0; r0 < M; r0 += kTileRows) {
        up_to<kTileRows>(M - r0, [&]<int kR>() {
          VecF acc[kR];
          slice.template operator()<kR>(r0, tile, h, acc);
          for (int r = 0; r < kR; ++r) {
            float out[kVectorColumns];
            store_columns(acc[r], out);
            std::memcpy(y + (r0 + r) * ldy + p.row0 + from, out + (from - c0), (to - from) * 4);
          }
        });
      }
    }
  }
}

}  // namespace radixrt::gguf
