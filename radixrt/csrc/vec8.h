// Eight-float vectors for radixrt's CPU kernels: GCC/Clang vector extensions, which are AVX2
// registers under -march=native on x86 and SSE or NEON pairs elsewhere.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace radixrt_vec8 {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

constexpr int kLanes = 8;

inline v8f splat(float x) { return v8f{} + x; }

// exp(x) = 2^n * exp(r) with n = round(x / ln2), |r| <= ln2 / 2, exp(r) by its degree-6 Taylor
// polynomial (relative error ~2e-7); exactly 0 below -87 (a masked score is -inf).
inline v8f vexp(v8f x) {
  const v8f lo = splat(-87.0f), hi = splat(88.0f);
  v8f xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const v8f magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  v8f n = (xc * splat(1.44269504f) + magic) - magic;
  v8f r = xc - n * splat(0.693359375f) + n * splat(2.12194440e-4f);
  v8f p = splat(1.0f / 720);
  p = p * r + splat(1.0f / 120);
  p = p * r + splat(1.0f / 24);
  p = p * r + splat(1.0f / 6);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8f scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < lo ? splat(0.0f) : p * scale;
}

inline v8f vmax(v8f a, v8f b) { return a > b ? a : b; }

template <typename T>
inline float to_float(T x) {
  return static_cast<float>(x);
}

template <typename T>
inline v8f load8(const T* p) {
  v8f r;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&r, p, sizeof(r));
  } else {
    for (int i = 0; i < kLanes; ++i) r[i] = to_float(p[i]);
  }
  return r;
}

inline float hsum(v8f x) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += x[i];
  return s;
}

}  // namespace radixrt_vec8
