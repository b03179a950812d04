// The integer narrow kernel (gguf_dot8.h): y = x W.T for few rows of x, x rounded to int8
// per block. gguf_linear.cpp calls int8_linear for steps of up to `int8_rows` rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gguf_types.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "gguf_dot8.h"
#define RADIXRT_DOT8 1
#endif

namespace radixrt::gguf {

bool int8_supported() {
#ifdef RADIXRT_DOT8
  return true;
#else
  return false;
#endif
}

#ifdef RADIXRT_DOT8
namespace {

constexpr int64_t kRowsPerPass = 4;
constexpr int64_t kPrefetchBytes = 4096;
template <int64_t T>
constexpr bool kPer32 = T == Q4_K || T == Q5_K || T == IQ4_XS;  // one scale per sub-block

float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One 32-weight block into each row's float sums: d dx sum(u x8), and the offset b dx sum(x8).
template <int M, int64_t T>
inline void add_block(const uint8_t* blk, const Q8Rows& a, int64_t r0, int64_t b, __m256* acc,
                      float* extra) {
  float d, off;
  block_scale<T>(blk, d, off);
  const __m256i codes = raw32<T>(blk, 0);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < M; ++r) {
    const int64_t ab = (r0 + r) * (a.K / 32) + b;  // the block of x
    const __m256i x = load32(reinterpret_cast<const uint8_t*>(a.q.data() + ab * 32));
    const __m256i sums = _mm256_madd_epi16(pair_products<T>(codes, x), ones);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(d * a.d[ab]), acc[r]);
    if (off != 0.0f) extra[r] += off * a.d[ab] * (a.sums[2 * ab] + a.sums[2 * ab + 1]);
  }
}

// One 256-weight super-block: sums of sc u x8 in int32 over its 8 sub-blocks, then
// d dx that - dmin dx sum(mn x8) in float.
template <int M, int64_t T>
inline void add_super_block(const uint8_t* blk, const Q8Rows& a, int64_t r0, int64_t b,
                            __m256* acc) {
  KScales k;
  kscales<T>(blk, k);
  __m256i isum[M];
  for (auto& v : isum) v = _mm256_setzero_si256();
  const int8_t* xq = a.q.data() + b * 256;
  for (int s = 0; s < 8; ++s) {
    const __m256i codes = raw32<T>(blk, s);
    const __m256i scale = kPer32<T> ? _mm256_set1_epi16(k.sc[2 * s])
                                    : _mm256_set_m128i(_mm_set1_epi16(k.sc[2 * s + 1]),
                                                       _mm_set1_epi16(k.sc[2 * s]));
    for (int r = 0; r < M; ++r) {
      const __m256i x = load32(reinterpret_cast<const uint8_t*>(xq + (r0 + r) * a.K + 32 * s));
      isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pair_products<T>(codes, x), scale));
    }
  }
  const __m256i mins = _mm256_load_si256((const __m256i*)k.mn);
  for (int r = 0; r < M; ++r) {
    const int64_t ab = (r0 + r) * (a.K / 256) + b;
    const float dx = a.d[ab];
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(k.d * dx), acc[r]);
    if constexpr (T != IQ4_XS) {
      const __m256i x_sums = _mm256_loadu_si256((const __m256i*)(a.sums.data() + ab * 16));
      const __m256 m = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, x_sums));
      acc[r] = _mm256_fnmadd_ps(m, _mm256_set1_ps(k.dmin * dx), acc[r]);
    }
  }
}

// Output columns [n0, n1) of one part for rows r0 .. r0 + M of the quantized x.
template <int M, int64_t T>
void dot8_rows(const Q8Rows& a, int64_t r0, const Part& p, int64_t n0, int64_t n1, float* y,
               int64_t ldy) {
  constexpr int64_t kW = Traits<T>::weights, kB = Traits<T>::bytes;
  const int64_t nb = a.K / kW;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = p.data + n * p.row_bytes;
    __m256 acc[M];
    float extra[M] = {};
    for (auto& v : acc) v = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * kB;
      _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
      if constexpr (kW == 32) add_block<M, T>(blk, a, r0, b, acc, extra);
      else add_super_block<M, T>(blk, a, r0, b, acc);
    }
    for (int r = 0; r < M; ++r) y[(r0 + r) * ldy + p.row0 + n] = hsum(acc[r]) + extra[r];
  }
}

using Dot8Fn = void (*)(const Q8Rows&, int64_t, const Part&, int64_t, int64_t, float*, int64_t);

template <int64_t T>
Dot8Fn dot8_fn(int64_t m) {
  switch (m) {
    case 1: return dot8_rows<1, T>;
    case 2: return dot8_rows<2, T>;
    case 3: return dot8_rows<3, T>;
    default: return dot8_rows<4, T>;
  }
}

}  // namespace

// Blocks of `group` inputs: d = max|x| / 127, q = round(x / d) (ties to even: the CPU's
// rounding mode), as llama.cpp's Q8_0 / Q8_K do (they round ties away from zero: a tie is rare
// in float inputs); the codes' sums per 16 beside them.
Q8Rows quantize_rows(const float* x, int64_t M, int64_t K, int64_t group) {
  Q8Rows a;
  a.K = K, a.group = group;
  a.q.resize(M * K);
  a.d.resize(M * K / group);
  a.sums.resize(M * K / 16);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < M * K / group; ++b) {
    const float* xb = x + b * group;
    __m256 vmax = _mm256_setzero_ps();
    for (int64_t j = 0; j < group; j += 8)
      vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
    const float amax = hmax(vmax);
    const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    a.d[b] = d;
    for (int64_t j = 0; j < group; j += 16) {
      const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), _mm256_set1_ps(id)));
      const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8), _mm256_set1_ps(id)));
      // packs works within 128-bit lanes: 16-bit [lo0-3 hi0-3 | lo4-7 hi4-7], fixed by permute.
      const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
      const __m128i w8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + b * group + j), w8);
      const __m256i pair = _mm256_madd_epi16(w16, _mm256_set1_epi16(1));
      a.sums[(b * group + j) / 16] = static_cast<int16_t>(hsum_i32(pair));
    }
  }
  return a;
}

at::Tensor int8_linear(const at::Tensor& x, const Layout& l) {
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, l.N}, x.options());
  bool small = false, large = false;
  for (const Part& p : l.parts) {
    dispatch(p.type, [&]<int64_t T>() { (Traits<T>::weights == 32 ? small : large) = true; });
  }
  const float* xp = x.data_ptr<float>();
  const Q8Rows by32 = small ? quantize_rows(xp, M, l.K, 32) : Q8Rows{};
  const Q8Rows by256 = large ? quantize_rows(xp, M, l.K, 256) : Q8Rows{};
  float* yp = y.data_ptr<float>();
  for (const Part& p : l.parts)
    for (int64_t r0 = 0; r0 < M; r0 += kRowsPerPass) {
      Dot8Fn fn = nullptr;
      const Q8Rows* a = nullptr;
      dispatch(p.type, [&]<int64_t T>() {
        fn = dot8_fn<T>(std::min(kRowsPerPass, M - r0));
        a = Traits<T>::weights == 32 ? &by32 : &by256;
      });
      at::parallel_for(0, p.rows, 16, [&](int64_t n0, int64_t n1) {
        fn(*a, r0, p, n0, n1, yp, l.N);
      });
    }
  return y;
}
#else
at::Tensor int8_linear(const at::Tensor&, const Layout&) {
  TORCH_CHECK(false, "gguf_linear: the int8 kernel needs AVX2, FMA and F16C");
}
#endif

}  // namespace radixrt::gguf
