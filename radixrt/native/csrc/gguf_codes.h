// The codes and scales of one sub-block of 32 weights (gguf_types.h's common form) with SSE
// integer ops, for the AVX2 and AVX-512 kernels: q[0] holds elements 0..15, q[1] 16..31, as
// int8 lanes; a[h], b[h] scale and offset half h. decode_sub writes the codes byte by byte,
// which compilers vectorize for some types and not others (4-8x slower there), and whose byte
// stores then stall the vector loads that read them back; these stay in registers.
// Shifts are of 16-bit lanes, so each is followed by a mask that keeps only bits of its own byte.
#pragma once

#include <immintrin.h>

#include "gguf_types.h"

namespace radixrt::gguf {

struct Codes {
  __m128i q[2];
  float a[2], b[2];
};

inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128((const __m128i*)p); }
inline __m128i low_bits(__m128i v, int shift, int mask) {
  return _mm_and_si128(_mm_srli_epi16(v, shift), _mm_set1_epi8(static_cast<char>(mask)));
}

inline void same_scale(Codes& c, float a, float b) {
  c.a[0] = c.a[1] = a;
  c.b[0] = c.b[1] = b;
}

// 16 bytes of nibbles: elements 0..15 the low ones, 16..31 the high ones.
inline void split_nibbles(const uint8_t* qs, __m128i q[2]) {
  const __m128i v = load16(qs);
  q[0] = low_bits(v, 0, 0xF);
  q[1] = low_bits(v, 4, 0xF);
}

// Bit j of a 32-bit mask as byte j (16 bytes per half): 0x10 where set, else 0.
inline void fifth_bits(const uint8_t* qh_bytes, __m128i bits[2]) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const __m128i all = _mm_set1_epi32(static_cast<int>(qh));
  const __m128i select = _mm_set1_epi64x(0x8040201008040201LL);
  for (int h = 0; h < 2; ++h) {
    // Byte j of this half takes the mask's byte 2h + j / 8, then tests its bit j % 8.
    const __m128i spread = _mm_shuffle_epi8(
        all, _mm_setr_epi8(2 * h, 2 * h, 2 * h, 2 * h, 2 * h, 2 * h, 2 * h, 2 * h, 2 * h + 1,
                           2 * h + 1, 2 * h + 1, 2 * h + 1, 2 * h + 1, 2 * h + 1, 2 * h + 1,
                           2 * h + 1));
    const __m128i set = _mm_cmpeq_epi8(_mm_and_si128(spread, select), select);
    bits[h] = _mm_and_si128(set, _mm_set1_epi8(0x10));
  }
}

inline __m128i iq4_values(__m128i nibbles) {
  return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)kIQ4Values), nibbles);
}

template <int64_t T> void codes(const uint8_t* blk, int s, Codes& c);

template <> inline void codes<Q4_0>(const uint8_t* blk, int, Codes& c) {
  same_scale(c, fp16(blk), 0.0f);
  split_nibbles(blk + 2, c.q);
  for (auto& q : c.q) q = _mm_sub_epi8(q, _mm_set1_epi8(8));
}
template <> inline void codes<Q4_1>(const uint8_t* blk, int, Codes& c) {
  same_scale(c, fp16(blk), fp16(blk + 2));
  split_nibbles(blk + 4, c.q);
}
template <> inline void codes<Q5_0>(const uint8_t* blk, int, Codes& c) {
  same_scale(c, fp16(blk), 0.0f);
  __m128i high[2];
  fifth_bits(blk + 2, high);
  split_nibbles(blk + 6, c.q);
  for (int h = 0; h < 2; ++h) c.q[h] = _mm_sub_epi8(_mm_or_si128(c.q[h], high[h]), _mm_set1_epi8(16));
}
template <> inline void codes<Q5_1>(const uint8_t* blk, int, Codes& c) {
  same_scale(c, fp16(blk), fp16(blk + 2));
  __m128i high[2];
  fifth_bits(blk + 4, high);
  split_nibbles(blk + 8, c.q);
  for (int h = 0; h < 2; ++h) c.q[h] = _mm_or_si128(c.q[h], high[h]);
}
template <> inline void codes<Q8_0>(const uint8_t* blk, int, Codes& c) {
  same_scale(c, fp16(blk), 0.0f);
  c.q[0] = load16(blk + 2);
  c.q[1] = load16(blk + 18);
}
template <> inline void codes<IQ4_NL>(const uint8_t* blk, int, Codes& c) {
  same_scale(c, fp16(blk), 0.0f);
  split_nibbles(blk + 2, c.q);
  for (auto& q : c.q) q = iq4_values(q);
}
template <> inline void codes<Q2_K>(const uint8_t* blk, int s, Codes& c) {
  const float d = fp16(blk + 80), dmin = fp16(blk + 82);
  const uint8_t* qs = blk + 16 + 32 * (s / 4);
  for (int h = 0; h < 2; ++h) {
    c.q[h] = low_bits(load16(qs + 16 * h), 2 * (s % 4), 3);
    const uint8_t sc = blk[2 * s + h];
    c.a[h] = d * static_cast<float>(sc & 0xF);
    c.b[h] = -(dmin * static_cast<float>(sc >> 4));
  }
}
template <> inline void codes<Q3_K>(const uint8_t* blk, int s, Codes& c) {
  const uint8_t* qs = blk + 32 + 32 * (s / 4);
  const uint8_t* sc = blk + 96;
  const float d = fp16(blk + 108);
  for (int h = 0; h < 2; ++h) {
    const __m128i low = low_bits(load16(qs + 16 * h), 2 * (s % 4), 3);
    const __m128i high = _mm_slli_epi16(low_bits(load16(blk + 16 * h), s, 1), 2);
    c.q[h] = _mm_sub_epi8(_mm_add_epi8(low, high), _mm_set1_epi8(4));  // bit clear: -4
    const int i = 2 * s + h;
    const int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4;
    const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    c.a[h] = d * static_cast<float>((lo | hi << 4) - 32);
    c.b[h] = 0.0f;
  }
}
template <> inline void codes<Q4_K>(const uint8_t* blk, int s, Codes& c) {
  int sc, m;
  scale_min_k4(blk + 4, s, sc, m);
  same_scale(c, fp16(blk) * static_cast<float>(sc), -(fp16(blk + 2) * static_cast<float>(m)));
  const uint8_t* qs = blk + 16 + 32 * (s / 2);
  for (int h = 0; h < 2; ++h) c.q[h] = low_bits(load16(qs + 16 * h), 4 * (s % 2), 0xF);
}
template <> inline void codes<Q5_K>(const uint8_t* blk, int s, Codes& c) {
  int sc, m;
  scale_min_k4(blk + 4, s, sc, m);
  same_scale(c, fp16(blk) * static_cast<float>(sc), -(fp16(blk + 2) * static_cast<float>(m)));
  const uint8_t* qs = blk + 48 + 32 * (s / 2);
  for (int h = 0; h < 2; ++h) {
    const __m128i high = _mm_slli_epi16(low_bits(load16(blk + 16 + 16 * h), s, 1), 4);
    c.q[h] = _mm_or_si128(low_bits(load16(qs + 16 * h), 4 * (s % 2), 0xF), high);
  }
}
template <> inline void codes<Q6_K>(const uint8_t* blk, int s, Codes& c) {
  const int half = s / 4, r = s % 4;
  const uint8_t* ql = blk + 64 * half + 32 * (r % 2);
  const uint8_t* qh = blk + 128 + 32 * half;
  const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = fp16(blk + 208);
  for (int h = 0; h < 2; ++h) {
    const __m128i low = low_bits(load16(ql + 16 * h), 4 * (r / 2), 0xF);
    const __m128i high = _mm_slli_epi16(low_bits(load16(qh + 16 * h), 2 * r, 3), 4);
    c.q[h] = _mm_sub_epi8(_mm_or_si128(low, high), _mm_set1_epi8(32));
    c.a[h] = d * static_cast<float>(scales[2 * s + h]);
    c.b[h] = 0.0f;
  }
}
template <> inline void codes<IQ4_XS>(const uint8_t* blk, int s, Codes& c) {
  uint16_t high;
  std::memcpy(&high, blk + 2, 2);
  const int lo = (blk[4 + s / 2] >> (4 * (s % 2))) & 0xF;
  const int hi = (high >> (2 * s)) & 3;
  same_scale(c, fp16(blk) * static_cast<float>((lo | hi << 4) - 32), 0.0f);
  split_nibbles(blk + 8 + 16 * s, c.q);
  for (auto& q : c.q) q = iq4_values(q);
}

}  // namespace radixrt::gguf
