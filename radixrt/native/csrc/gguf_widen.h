// GGUF sub-blocks widened to float32 vectors, and the one order in which the float kernels
// (gguf_linear.cpp's narrow one, float_matmul.cpp's wide one) sum a dot product: so that an
// input row's result is the same bits whatever the step's row count (docs/determinism.md).
//
// The order: y[r][n] = vsum(c), where the chain c starts at zero and takes one fma per kLanes
// weights, k ascending (a sub-block's kVecs vectors in turn; a dense weight's last partial
// vector padded with zeros), and vsum is the fixed tree below.
#pragma once

#include <cstdint>
#include <cstring>

#include "gguf_layout.h"
#include "gguf_types.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "gguf_codes.h"
#define RADIXRT_AVX2 1
#if defined(__AVX512F__)
#define RADIXRT_AVX512 1
#endif
#endif

namespace radixrt::gguf::floats {

// ---- Sub-blocks as floats ------------------------------------------------------------------
// w = a q + b per 16 weights; fma rounds once, as gguf-py's product-then-sum does (a q exact).
inline void sub_to_floats(const Sub& o, float* out) {
  for (int j = 0; j < 32; ++j)
    out[j] = __builtin_fmaf(o.a[j / 16], static_cast<float>(o.q[j]), o.b[j / 16]);
}

#ifdef RADIXRT_AVX512
// 4-bit types: the 16 values a code can stand for form a table (a * iota + b, or a times
// IQ4's non-linear values) that each code indexes with one permute, which reads only an
// index's low 4 bits: no mask, and no int-to-float conversion per weight.
template <int64_t T>
constexpr bool kNibbleTable = T == Q4_0 || T == Q4_1 || T == Q4_K || T == IQ4_NL || T == IQ4_XS;

template <int64_t T>
inline void table_weights32(const uint8_t* blk, int s, __m512 w[2]) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  Codes c;
  codes<T>(blk, s, c);  // for its scales; the compiler drops the unused codes
  __m512 table;
  if constexpr (T == IQ4_NL || T == IQ4_XS) {
    const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(
        reinterpret_cast<const uint8_t*>(kIQ4Values))));
    table = _mm512_mul_ps(_mm512_set1_ps(c.a[0]), values);
  } else {
    const float b = T == Q4_0 ? -8.0f * c.a[0] : c.b[0];  // exact: a power-of-two multiple
    table = _mm512_fmadd_ps(_mm512_set1_ps(c.a[0]), iota, _mm512_set1_ps(b));
  }
  if constexpr (T == Q4_K) {  // 32 bytes, one nibble each
    const uint8_t* qs = blk + 16 + 32 * (s / 2);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_cvtepu8_epi32(load16(qs + 16 * h));
      w[h] = _mm512_permutexvar_ps(s % 2 ? _mm512_srli_epi32(q, 4) : q, table);
    }
  } else {  // 16 bytes: low nibbles, then high ones
    const int offset = T == Q4_1 ? 4 : T == IQ4_XS ? 8 + 16 * s : 2;
    const __m512i q = _mm512_cvtepu8_epi32(load16(blk + offset));
    w[0] = _mm512_permutexvar_ps(q, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
  }
}

template <int64_t T>
inline void weights32(const uint8_t* blk, int s, __m512 w[2]) {
  if constexpr (kNibbleTable<T>) {
    table_weights32<T>(blk, s, w);
  } else {
    Codes c;
    codes<T>(blk, s, c);
    for (int h = 0; h < 2; ++h) {
      const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c.q[h]));
      w[h] = _mm512_fmadd_ps(_mm512_set1_ps(c.a[h]), q, _mm512_set1_ps(c.b[h]));
    }
  }
}
using Vec = __m512;
constexpr int kVecs = 2;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vfma(Vec a, const float* x, Vec acc) { return _mm512_fmadd_ps(a, _mm512_loadu_ps(x), acc); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
// The first n < 16 floats at p, zeros after: a dense weight's last, partial vector.
inline Vec vload_first(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}
#elif defined(RADIXRT_AVX2)
template <int64_t T>
inline void weights32(const uint8_t* blk, int s, __m256 w[4]) {
  Codes c;
  codes<T>(blk, s, c);
  for (int i = 0; i < 4; ++i) {
    const __m128i q8 = i % 2 ? _mm_srli_si128(c.q[i / 2], 8) : c.q[i / 2];
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
    w[i] = _mm256_fmadd_ps(_mm256_set1_ps(c.a[i / 2]), q, _mm256_set1_ps(c.b[i / 2]));
  }
}
using Vec = __m256;
constexpr int kVecs = 4;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vfma(Vec a, const float* x, Vec acc) { return _mm256_fmadd_ps(a, _mm256_loadu_ps(x), acc); }
inline Vec vload_first(const float* p, int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane));
}
inline float vsum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

#ifdef RADIXRT_AVX2
constexpr int64_t kLanes = 32 / kVecs;  // floats per vector
#endif

// ---- Dequantizing --------------------------------------------------------------------------
template <int64_t T>
void dequantize_row(const uint8_t* row, int64_t K, float* out) {
  constexpr int64_t kW = Traits<T>::weights, kB = Traits<T>::bytes;
  for (int64_t b = 0; b < K / kW; ++b)
    for (int s = 0; s < kW / 32; ++s) {
      float* dst = out + b * kW + s * 32;
#ifdef RADIXRT_AVX2
      Vec w[kVecs];
      weights32<T>(row + b * kB, s, w);
      for (int v = 0; v < kVecs; ++v) std::memcpy(dst + v * kLanes, &w[v], sizeof(Vec));
#else
      Sub o;
      decode_sub<T>(row + b * kB, s, o);
      sub_to_floats(o, dst);
#endif
    }
}

// Weight rows [n0, n0 + rows) of the whole layout as float32 into out (row stride K).
inline void dequantize_rows(const Layout& l, int64_t n0, int64_t rows, float* out) {
  for (const Part& p : l.parts) {
    const int64_t lo = std::max(n0, p.row0), hi = std::min(n0 + rows, p.row0 + p.rows);
    dispatch(p.type, [&]<int64_t T>() {
      for (int64_t n = lo; n < hi; ++n)
        dequantize_row<T>(p.data + (n - p.row0) * p.row_bytes, l.K, out + (n - n0) * l.K);
    });
  }
}

}  // namespace radixrt::gguf::floats
