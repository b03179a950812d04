// y = x W.T with int8 weights and int8 activations (W8A8, `--cpu-dense-copy-dtype int8`):
// the weight per output channel, w[n, k] ~ w_scale[n] * wq[n, k]; each row of x quantized on
// the fly, x[m, k] ~ x_scale[m] * xq[m, k], x_scale = max|x[m, :]| / 127 (SGLang's per-token
// dynamic int8). The integer products are summed exactly in int32 by oneDNN's s8 x s8 GEMM
// (at::_int_mm: VNNI's vpdpbusd, about twice the bfloat16 rate on a CPU with AVX-512 BF16),
// then y[m, n] = acc[m, n] * (x_scale[m] * w_scale[n]), rounded to x's dtype.
//
// The integer sums do not depend on the other rows, so a row's result is the same in any
// batch. radixrt/layers/quantized.py's w8a8_reference is the same arithmetic in torch ops,
// bit for bit (tests/unit/test_w8a8.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "ops.h"

namespace {

inline float load_float(float x) { return x; }
inline float load_float(c10::BFloat16 x) { return static_cast<float>(x); }

#if defined(__AVX512F__)
inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const c10::BFloat16* x) {  // bf16 -> f32 is a 16-bit shift, exact
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

// One row: its int8 codes and its scale (0 for a row of zeros, whose codes are all 0).
template <typename T>
void quantize_row(const T* x, int64_t K, int8_t* q, float* scale) {
  float amax = 0.0f;
  int64_t k = 0;
#if defined(__AVX512F__)
  __m512 vmax = _mm512_setzero_ps();
  for (; k + 16 <= K; k += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(load16(x + k)));
  amax = _mm512_reduce_max_ps(vmax);
#endif
  for (; k < K; ++k) amax = std::max(amax, std::fabs(load_float(x[k])));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  k = 0;
#if defined(__AVX512F__)
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (; k + 16 <= K; k += 16) {
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(load16(x + k), vinv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r)));
  }
#endif
  for (; k < K; ++k) {
    // nearbyint rounds half to even, as torch.round does; the clamp only catches x * inv
    // landing a hair above 127.
    const float r = std::nearbyint(load_float(x[k]) * inv);
    q[k] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
  }
  *scale = amax / 127.0f;
}

template <typename T>
void quantize_rows(const at::Tensor& x, at::Tensor& xq, at::Tensor& x_scale) {
  const int64_t K = x.size(1);
  const T* src = x.data_ptr<T>();
  int8_t* dst = xq.data_ptr<int8_t>();
  float* scale = x_scale.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) quantize_row(src + m * K, K, dst + m * K, scale + m);
  });
}

// A row of the result: acc * (x_scale * w_scale), rounded to bfloat16 to nearest even (torch's
// .to(bfloat16) for finite values) or kept in float32.
inline void dequantize_row(const int32_t* acc, float xs, const float* ws, int64_t N, float* y) {
  for (int64_t n = 0; n < N; ++n) y[n] = static_cast<float>(acc[n]) * (xs * ws[n]);
}

inline void dequantize_row(const int32_t* acc, float xs, const float* ws, int64_t N,
                           c10::BFloat16* y) {
  int64_t n = 0;
#if defined(__AVX512BF16__)
  const __m512 vxs = _mm512_set1_ps(xs);
  for (; n + 16 <= N; n += 16) {
    const __m512 a = _mm512_cvtepi32_ps(_mm512_loadu_si512(acc + n));
    const __m512 v = _mm512_mul_ps(a, _mm512_mul_ps(vxs, _mm512_loadu_ps(ws + n)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + n), (__m256i)_mm512_cvtneps_pbh(v));
  }
#endif
  for (; n < N; ++n) y[n] = c10::BFloat16(static_cast<float>(acc[n]) * (xs * ws[n]));
}

template <typename T>
at::Tensor dequantize(const at::Tensor& acc, const at::Tensor& x_scale, const at::Tensor& w_scale,
                      at::ScalarType dtype) {
  const int64_t M = acc.size(0), N = acc.size(1);
  at::Tensor y = at::empty({M, N}, acc.options().dtype(dtype));
  const int32_t* a = acc.data_ptr<int32_t>();
  const float* xs = x_scale.data_ptr<float>();
  const float* ws = w_scale.data_ptr<float>();
  T* out = y.data_ptr<T>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1));
  at::parallel_for(0, M, grain, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) dequantize_row(a + m * N, xs[m], ws, N, out + m * N);
  });
  return y;
}

}  // namespace

namespace radixrt {

// x [M, K] float32 or bfloat16; wq int8 [N, K]; w_scale float32 [N] -> [M, N] in x's dtype.
at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& w_scale) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "w8a8_linear: x must be float32 or bfloat16 [M, K], got ", x.scalar_type(), " of ",
              x.dim(), " dims");
  TORCH_CHECK(wq.dim() == 2 && wq.scalar_type() == at::kChar && wq.size(1) == x.size(1) &&
                  wq.is_contiguous(),
              "w8a8_linear: weight must be contiguous int8 [N, ", x.size(1), "]");
  TORCH_CHECK(w_scale.dim() == 1 && w_scale.scalar_type() == at::kFloat &&
                  w_scale.size(0) == wq.size(0) && w_scale.is_contiguous(),
              "w8a8_linear: w_scale must be contiguous float32 [", wq.size(0), "]");
  const at::Tensor xc = x.contiguous();
  at::Tensor xq = at::empty(xc.sizes(), xc.options().dtype(at::kChar));
  at::Tensor x_scale = at::empty({xc.size(0)}, xc.options().dtype(at::kFloat));
  if (xc.scalar_type() == at::kFloat)
    quantize_rows<float>(xc, xq, x_scale);
  else
    quantize_rows<c10::BFloat16>(xc, xq, x_scale);
  const at::Tensor acc = at::_int_mm(xq, wq.t());
  if (xc.scalar_type() == at::kFloat) return dequantize<float>(acc, x_scale, w_scale, at::kFloat);
  return dequantize<c10::BFloat16>(acc, x_scale, w_scale, at::kBFloat16);
}

}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def("w8a8_linear(Tensor x, Tensor wq, Tensor w_scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) { m.impl("w8a8_linear", radixrt::w8a8_linear); }
