// Eight-float vectors for radixrt's CPU kernels: GCC/Clang vector extensions, which are AVX2
// registers under -march=native on x86 and SSE or NEON pairs elsewhere. splat, vexp and vmax
// are templates over the vector type (paged_attention.cpp's prefill tile uses 16 floats on
// AVX-512).
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace radixrt_vec8 {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

constexpr int kLanes = 8;

template <typename V = v8f>
inline V splat(float x) {
  return V{} + x;
}

// exp(x) = 2^n * exp(r) with n = round(x / ln2), |r| <= ln2 / 2, exp(r) by its degree-6 Taylor
// polynomial (relative error ~2e-7); exactly 0 below -87 (a masked score is -inf).
template <typename V>
inline V vexp(V x) {
  using IV = decltype(x < x);  // the int32 vector of as many lanes
  const V lo = splat<V>(-87.0f), hi = splat<V>(88.0f);
  V xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const V magic = splat<V>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  V n = (xc * splat<V>(1.44269504f) + magic) - magic;
  V r = xc - n * splat<V>(0.693359375f) + n * splat<V>(2.12194440e-4f);
  V p = splat<V>(1.0f / 720);
  p = p * r + splat<V>(1.0f / 120);
  p = p * r + splat<V>(1.0f / 24);
  p = p * r + splat<V>(1.0f / 6);
  p = p * r + splat<V>(0.5f);
  p = p * r + splat<V>(1.0f);
  p = p * r + splat<V>(1.0f);
  IV bits = (__builtin_convertvector(n, IV) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < lo ? splat<V>(0.0f) : p * scale;
}

// a * b + c rounded once, whatever the compiler's contraction setting: the attention kernels
// name each fused multiply-add, so that two loops meant to agree bit for bit do.
template <typename V>
inline V fmadd(V a, V b, V c) {
#if defined(__FMA__)
  if constexpr (sizeof(V) == 32) return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#endif
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#endif
  V r;
  for (int i = 0; i < static_cast<int>(sizeof(V) / sizeof(float)); ++i)
    r[i] = std::fma(a[i], b[i], c[i]);
  return r;
}

template <typename V>
inline V vmax(V a, V b) {
  return a > b ? a : b;
}

template <typename T>
inline float to_float(T x) {
  return static_cast<float>(x);
}

typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

// Eight consecutive values as floats. bfloat16 is the top half of a float32: widened and
// shifted as one vector (a decode step's K and V reads; element by element, converting them
// took longer than the attention's arithmetic at batch 64).
template <typename T>
inline v8f load8(const T* p) {
  v8f r;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&r, p, sizeof(r));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    v8u16 bits;
    std::memcpy(&bits, p, sizeof(bits));
    const v8u wide = __builtin_convertvector(bits, v8u) << 16;
    std::memcpy(&r, &wide, sizeof(r));
  } else {
    for (int i = 0; i < kLanes; ++i) r[i] = to_float(p[i]);
  }
  return r;
}

// Whether load8 / store8 / round_to handle T as vectors (float and bfloat16; others go
// element by element through their scalar type).
template <typename T>
constexpr bool kVectorized = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;

// The bits of x rounded to bfloat16 (to nearest even, NaN to 0x7fc0: c10's rounding), in the
// top half of each lane.
inline v8u bf16_bits(v8f x) {
  v8u u;
  std::memcpy(&u, &x, sizeof(u));
  const v8u rounded = (u + (((u >> 16) & 1u) + 0x7fffu)) & 0xffff0000u;
  return x != x ? v8u{} + 0x7fc00000u : rounded;
}

// x rounded to T's precision and back to float: float arithmetic that rounds where torch's
// arithmetic in T rounds (each bfloat16 op is a float op rounded to bfloat16).
template <typename T>
inline v8f round_to(v8f x) {
  static_assert(kVectorized<T>);
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    const v8u bits = bf16_bits(x);
    v8f r;
    std::memcpy(&r, &bits, sizeof(r));
    return r;
  }
}

// Eight floats stored as T (bfloat16 rounded as c10 rounds).
template <typename T>
inline void store8(T* p, v8f x) {
  static_assert(kVectorized<T>);
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(p, &x, sizeof(x));
  } else {
    const v8u16 half = __builtin_convertvector(bf16_bits(x) >> 16, v8u16);
    std::memcpy(p, &half, sizeof(half));
  }
}

// A tree of three shuffles and adds (a decode tile sums one per key and head; lane by lane
// that was 8 dependent scalar adds).
inline float hsum(v8f x) {
  x += __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3);
  x += __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5);
  x += __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6);
  return x[0];
}

}  // namespace radixrt_vec8
