// Matmuls in integers, as llama.cpp computes them: each input row is rounded to int8 once per
// call (scale max|x| / 127 per block: 32 inputs for the 32-weight types, 256 for the
// K-quants), and each weight sub-block's codes meet those int8 inputs in exact integer sums
// (maddubs and madd, or VNNI's dpbusd), one float step per block (per 8 blocks for the
// 32-weight types). A decode step is bound by these instructions, not by memory, on small
// CPUs: integers do a sub-block in about a third of the float kernel's instructions. The
// rounding of x is the only inexact step: its error bound is what
// tests/unit/test_gguf_blocks.py checks. Every row's arithmetic is the same whatever the
// number of rows, so a row's result does not depend on its batch.
//
// Codes here are raw (gguf_codes.h subtracts their bias for the float kernel): unsigned 0..63
// with w = d s (u - bias) for most types; Q8_0 and the IQ4 types are signed, multiplied by
// maddubs(|q|, x * sign(q)). No pair of products exceeds int16: 2 * 63 * 127 or 2 * 128 * 127.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "gguf_types.h"

namespace radixrt::gguf {

template <int64_t T>
constexpr bool kPer32 = T == Q4_K || T == Q5_K || T == IQ4_XS;  // one scale per sub-block
template <int64_t T>
constexpr bool kSigned = T == Q8_0 || T == IQ4_NL || T == IQ4_XS;

// ---- Inputs as int8 ------------------------------------------------------------------------
// Rows of x in blocks of `group` (32 or 256): int8 codes, a float scale per block, the sum
// of the codes per 16 (for the weights' offsets and minimums), and for blocks of 32 their
// scale times their codes' sum (as llama.cpp's Q8_1 keeps it). Blocks of 32 are `transposed`
// for steps of several row passes: in groups of 8, word k (4 codes) of the group's block i at
// byte 32 k + 4 i, the order in which the kernel meets the weights' transposed codes. Each
// row is padded with zero blocks to a whole group (`row_blocks` blocks a row).
struct Q8Rows {
  int64_t K = 0, group = 0, row_blocks = 0;
  bool transposed = false;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> sums;
  std::vector<float> dsum;
};

// x float32 or c10::BFloat16 [M, K], contiguous.
template <typename In>
Q8Rows quantize_rows(const In* x, int64_t M, int64_t K, int64_t group, bool transposed);

// Part-local columns [lo, hi) of a part with tiles (gguf_tiles.cpp) for the M rows of x (blocks
// of 32, not transposed) into y's rows (ldy floats apart), at the part's first column.
void tiled_columns(const Q8Rows& a, const Part& p, int64_t lo, int64_t hi, int64_t M, float* y,
                   int64_t ldy);
// The same for a K-quant part (gguf_ktiles.cpp), x in blocks of 256.
void ktiled_columns(const Q8Rows& a, const Part& p, int64_t lo, int64_t hi, int64_t M, float* y,
                    int64_t ldy);

// ---- Raw codes of a sub-block as 32 bytes ---------------------------------------------------
inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
inline __m256i bits256(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(static_cast<char>(mask)));
}
// 16 bytes of nibbles: low ones (elements 0..15), then high ones (16..31).
inline __m256i nibbles256(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128((const __m128i*)qs);
  const __m128i m = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
// Bit j of 32 bits as byte j: 0x10 where set.
inline __m256i fifth_bits256(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                       3, 3, 3, 3, 3, 3, 3));
  const __m256i select = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}
inline __m256i iq4_values256(__m256i nibbles) {
  const __m128i table = _mm_loadu_si128((const __m128i*)kIQ4Values);
  return _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles);
}

template <int64_t T>
inline __m256i raw32(const uint8_t* blk, int s) {
  if constexpr (T == Q4_0 || T == IQ4_NL) {
    const __m256i n = nibbles256(blk + 2);
    return T == IQ4_NL ? iq4_values256(n) : n;
  } else if constexpr (T == Q4_1) {
    return nibbles256(blk + 4);
  } else if constexpr (T == Q5_0) {
    return _mm256_or_si256(nibbles256(blk + 6), fifth_bits256(blk + 2));
  } else if constexpr (T == Q5_1) {
    return _mm256_or_si256(nibbles256(blk + 8), fifth_bits256(blk + 4));
  } else if constexpr (T == Q8_0) {
    return load32(blk + 2);
  } else if constexpr (T == Q2_K) {
    return bits256(load32(blk + 16 + 32 * (s / 4)), 2 * (s % 4), 3);
  } else if constexpr (T == Q3_K) {
    const __m256i low = bits256(load32(blk + 32 + 32 * (s / 4)), 2 * (s % 4), 3);
    return _mm256_or_si256(low, _mm256_slli_epi16(bits256(load32(blk), s, 1), 2));
  } else if constexpr (T == Q4_K) {
    return bits256(load32(blk + 16 + 32 * (s / 2)), 4 * (s % 2), 0xF);
  } else if constexpr (T == Q5_K) {
    const __m256i low = bits256(load32(blk + 48 + 32 * (s / 2)), 4 * (s % 2), 0xF);
    return _mm256_or_si256(low, _mm256_slli_epi16(bits256(load32(blk + 16), s, 1), 4));
  } else if constexpr (T == Q6_K) {
    const int half = s / 4, r = s % 4;
    const __m256i low = bits256(load32(blk + 64 * half + 32 * (r % 2)), 4 * (r / 2), 0xF);
    const __m256i high = bits256(load32(blk + 128 + 32 * half), 2 * r, 3);
    return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
  } else {  // IQ4_XS
    return iq4_values256(nibbles256(blk + 8 + 16 * s));
  }
}

// Pairs of products as int16: codes (unsigned, or signed through |q| and sign) times inputs.
template <int64_t T>
inline __m256i pair_products(__m256i codes, __m256i x) {
  if constexpr (kSigned<T>) return _mm256_maddubs_epi16(_mm256_abs_epi8(codes), _mm256_sign_epi8(x, codes));
  return _mm256_maddubs_epi16(codes, x);
}

// isum += pairs of products times their scales, two int16 products to each int32 lane: one
// VNNI dpwssd where the CPU has it, else madd then add (the same exact integers).
inline __m256i add_scaled(__m256i isum, __m256i pairs, __m256i scales) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(isum, pairs, scales);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(isum, pairs, scales);
#else
  return _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, scales));
#endif
}

// ---- Scales ---------------------------------------------------------------------------------
// The fp16 at `at` bytes into each of `count` blocks of `stride` bytes (zeros after them) as 8
// floats: gathered in two 64-bit integers (the integer units are idle in these kernels), then
// one conversion.
inline __m256 fp16x8(const uint8_t* at, int64_t stride, int count) {
  uint64_t words[2] = {0, 0};
  for (int i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, at + i * stride, 2);
    words[i / 4] |= static_cast<uint64_t>(h) << (16 * (i % 4));
  }
  const __m128i halves = _mm_set_epi64x(static_cast<long long>(words[1]), static_cast<long long>(words[0]));
  return _mm256_cvtph_ps(halves);
}

// The 32-weight types: w = d (u - bias) or d u + m, as w = d u + b; a scale d and offset b
// for each of `count` consecutive blocks (zero after them).
template <int64_t T>
inline void block_scales(const uint8_t* blocks, int count, __m256& d, __m256& b) {
  constexpr int64_t kB = Traits<T>::bytes;
  d = fp16x8(blocks, kB, count);
  if constexpr (T == Q4_1 || T == Q5_1) b = fp16x8(blocks + 2, kB, count);
  else if constexpr (T == Q4_0) b = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
  else if constexpr (T == Q5_0) b = _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
  else b = _mm256_setzero_ps();
}

// A super-block's integer scale and minimum per 16 weights, 16 int16 lanes each (a per-32
// value twice): w = d sc u - dmin mn. Kept in registers: each sub-block's scales are shuffled
// out of `sc` (scale_of), not broadcast from memory.
struct KScales {
  __m256i sc, mn;
  float d, dmin;
};

// Q4_K's and Q5_K's twelve bytes of 6-bit scales and minimums as eight bytes each, four at a
// time in 32-bit words (scale_min_k4 one at a time): scales 0-3 and minimums 0-3 are the low 6
// bits of bytes 0-3 and 4-7; scales and minimums 4-7 take their low 4 bits from the nibbles of
// bytes 8-11 and their high 2 from the top bits of bytes 0-3 and 4-7. In registers: bytes
// stored and reloaded as a wider word would stall on the store.
inline void unpack_k4_scales(const uint8_t* s12, uint64_t& sc, uint64_t& mn) {
  uint32_t w[3];
  std::memcpy(w, s12, 12);
  const uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, top2 = 0x03030303;
  const uint64_t sc_high = (w[2] & low4) | (((w[0] >> 6) & top2) << 4);
  const uint64_t mn_high = ((w[2] >> 4) & low4) | (((w[1] >> 6) & top2) << 4);
  sc = (w[0] & low6) | sc_high << 32;
  mn = (w[1] & low6) | mn_high << 32;
}

// Eight bytes, each twice, as 16 int16 lanes: a per-32 value for each 16 weights.
inline __m256i twice_per_16(uint64_t v) {
  const __m128i bytes = _mm_cvtsi64_si128(static_cast<long long>(v));
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(bytes, bytes));
}

template <int64_t T>
inline void kscales(const uint8_t* blk, KScales& k) {
  if constexpr (T == Q4_K || T == Q5_K) {
    k.d = fp16(blk), k.dmin = fp16(blk + 2);
    uint64_t sc, mn;
    unpack_k4_scales(blk + 4, sc, mn);
    k.sc = twice_per_16(sc), k.mn = twice_per_16(mn);
  } else if constexpr (T == Q2_K) {  // a byte per 16: scale in the low nibble, min high
    k.d = fp16(blk + 80), k.dmin = fp16(blk + 82);
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)blk));
    k.sc = _mm256_and_si256(bytes, _mm256_set1_epi16(0xF));
    k.mn = _mm256_srli_epi16(bytes, 4);
  } else if constexpr (T == Q3_K) {  // raw u = q + 4: the offset is 4 sc
    const uint8_t* sc = blk + 96;
    k.d = k.dmin = fp16(blk + 108);
    // Low 4 bits: bytes 0-7's low nibbles (scales 0-7), then their high ones (8-15); high 2
    // bits: bits 2(g/4) of byte 8 + g % 4.
    const __m128i low8 = _mm_loadl_epi64((const __m128i*)sc);
    const __m128i low4 = _mm_and_si128(_mm_unpacklo_epi64(low8, _mm_srli_epi16(low8, 4)),
                                       _mm_set1_epi8(0xF));
    uint32_t h;
    std::memcpy(&h, sc + 8, 4);
    const __m128i hw = _mm_set1_epi32(static_cast<int>(h));  // byte 8 + g % 4 at g % 4
    const __m128i high2 = _mm_and_si128(
        _mm_srlv_epi32(hw, _mm_setr_epi32(0, 2, 4, 6)),  // group of 4 g/4: shift 2(g/4)
        _mm_set1_epi8(3));
    const __m128i v = _mm_sub_epi8(_mm_or_si128(low4, _mm_slli_epi16(high2, 4)), _mm_set1_epi8(32));
    k.sc = _mm256_cvtepi8_epi16(v), k.mn = _mm256_slli_epi16(k.sc, 2);
  } else if constexpr (T == Q6_K) {  // raw u = q + 32: the offset is 32 sc
    k.d = k.dmin = fp16(blk + 208);
    k.sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(blk + 192)));
    k.mn = _mm256_slli_epi16(k.sc, 5);
  } else {  // IQ4_XS: signed values, no minimum; scale s in dword s, both its words
    uint16_t high;
    uint32_t low;
    std::memcpy(&high, blk + 2, 2);
    std::memcpy(&low, blk + 4, 4);
    k.d = fp16(blk), k.dmin = 0.0f;
    const __m256i lo = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(low)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        _mm256_set1_epi32(0xF));
    const __m256i hi = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(high), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        _mm256_set1_epi32(3));
    const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    k.sc = _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(sc, 16));
    k.mn = _mm256_setzero_si256();
  }
}

// Sub-block s's scales as 16 int16 lanes, one per pair of its products: word 2s and 2s + 1 of
// k.sc, each for 16 weights. Where a type has one scale per 32 both words are that scale, and
// one dword broadcast gives them; otherwise the low half takes word 2s and the high half 2s + 1.
template <int64_t T>
inline __m256i scale_of(const KScales& k, int s) {
  const __m256i pair = _mm256_permutevar8x32_epi32(k.sc, _mm256_set1_epi32(s));
  if constexpr (kPer32<T>) return pair;
  return _mm256_shuffle_epi8(pair, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                    2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}

}  // namespace radixrt::gguf
