// The small per-layer ops of a decoder step on the CPU, one call each instead of 5-20 aten ops:
// RMSNorm (with the residual add folded in), the rotary embedding in place, SwiGLU, and the
// store of new keys and values into the KV pool. At batch 1 a step runs ~60 of these ops per
// layer in torch, each a few microseconds of dispatch for a few hundred floats of work.
//
// Each op rounds where its torch reference (radixrt/layers/*.py) rounds: products and sums in
// the activation dtype, the norm's statistics in float32. Floating-point contraction is off
// so that a * b - c * d is two rounded products and a rounded difference, as in torch; the
// norm's mean of squares is torch's own reduction (its order decides the last bits).
// Small batches run on the calling thread: waking OpenMP's workers costs more than the work.
#pragma GCC optimize("fp-contract=off")
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "ops.h"
#include "vec8.h"

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per thread before the work is split

// Rows [0, rows) split over threads only when there is enough work.
template <typename F>
void for_rows(int64_t rows, int64_t row_size, const F& body) {
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(row_size, 1));
  if (rows <= grain) {
    body(0, rows);
  } else {
    at::parallel_for(0, rows, grain, body);
  }
}

void check_rows(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, op, ": expected [T, hidden] with unit stride");
}

// (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) over `half` pairs, each product rounded to the dtype;
// eight lanes at a time for float and bfloat16 (element by element, c10's bfloat16 arithmetic
// made a 2,000-token prefill's rotary 6x slower), the tail and other dtypes one by one.
template <typename scalar_t>
void rotate_row(scalar_t* a, scalar_t* b, const scalar_t* c, const scalar_t* s, int64_t half) {
  int64_t j = 0;
  if constexpr (radixrt_vec8::kVectorized<scalar_t>) {
    using namespace radixrt_vec8;
    for (; j + kLanes <= half; j += kLanes) {
      const v8f x1 = load8(a + j), x2 = load8(b + j), cj = load8(c + j), sj = load8(s + j);
      const v8f p = round_to<scalar_t>(x1 * cj), q = round_to<scalar_t>(x2 * sj);
      const v8f u = round_to<scalar_t>(x2 * cj), v = round_to<scalar_t>(x1 * sj);
      store8(a + j, p - q);
      store8(b + j, u + v);
    }
  }
  for (; j < half; ++j) {
    const scalar_t x1 = a[j], x2 = b[j];
    const scalar_t p = x1 * c[j], q = x2 * s[j], u = x2 * c[j], v = x1 * s[j];
    a[j] = p - q;
    b[j] = u + v;
  }
}

// mean(x^2) per row of x [T, hidden], as transformers' `x.float().pow(2).mean(-1)`: the
// squares here (pow(x, 2) is x * x in torch), their sum by torch's own reduction (its summation
// order is what makes RMSNorm equal transformers' bit for bit, tests/unit/test_model_blocks.py),
// then the division (torch's mean is that sum divided by the count). One aten call, not five:
// at batch 1 the five cost ~20 us a norm, 1.2 ms a step.
at::Tensor mean_squares(const at::Tensor& x) {
  const int64_t t = x.size(0), n = x.size(1);
  at::Tensor squares = at::empty({t, n}, x.options().dtype(at::kFloat));
  float* sq = squares.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "mean_squares", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const int64_t xs = x.stride(0);
    for_rows(t, n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = 0; j < n; ++j) {
          const float v = static_cast<float>(xp[r * xs + j]);
          sq[r * n + j] = v * v;
        }
    });
  });
  at::Tensor mean = at::sum(squares, -1);
  float* mp = mean.data_ptr<float>();
  for (int64_t r = 0; r < t; ++r) mp[r] = mp[r] / static_cast<float>(n);
  return mean;
}

// y = w * (x / sqrt(mean(x^2) + eps)) of one row, with the norm cast to scalar_t before the
// weight multiply (transformers' order).
template <typename scalar_t>
void norm_row(const scalar_t* x, const scalar_t* w, int64_t n, float mean_sq, float eps,
              scalar_t* y) {
  const float inv = 1.0f / std::sqrt(mean_sq + eps);
  for (int64_t j = 0; j < n; ++j) {
    const scalar_t normed = static_cast<scalar_t>(static_cast<float>(x[j]) * inv);
    y[j] = static_cast<scalar_t>(w[j] * normed);
  }
}

// silu(a) = a / (1 + exp(-a)) of n floats, eight at a time with radixrt's vector exp (within
// an ulp or two of torch's), the tail with std::exp.
void silu_floats(const float* a, int64_t n, float* out) {
  using namespace radixrt_vec8;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const v8f x = load8(a + j);
    const v8f s = x / (splat(1.0f) + vexp(-x));
    std::memcpy(out + j, &s, sizeof(s));
  }
  for (; j < n; ++j) out[j] = a[j] / (1.0f + std::exp(-a[j]));
}

// One row of SwiGLU: silu(gate) in float32, rounded to the dtype, times up in the dtype.
template <typename scalar_t>
void swiglu_row(const scalar_t* gate, const scalar_t* up, int64_t n, scalar_t* y) {
  constexpr int64_t kChunk = 256;
  float a[kChunk], s[kChunk];
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t len = std::min(kChunk, n - j0);
    if constexpr (std::is_same_v<scalar_t, float>) {
      silu_floats(gate + j0, len, s);
    } else {
      for (int64_t j = 0; j < len; ++j) a[j] = static_cast<float>(gate[j0 + j]);
      silu_floats(a, len, s);
    }
    for (int64_t j = 0; j < len; ++j) y[j0 + j] = static_cast<scalar_t>(s[j]) * up[j0 + j];
  }
}

}  // namespace

namespace radixrt {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "rms_norm");
  TORCH_CHECK(weight.dtype() == x.dtype() && weight.is_contiguous() && weight.numel() == x.size(1),
              "rms_norm: weight must be contiguous [hidden] in x's dtype");
  at::Tensor y = at::empty({x.size(0), x.size(1)}, x.options());
  const at::Tensor ms = mean_squares(x);
  const int64_t n = x.size(1), xs = x.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    const float* mp = ms.data_ptr<float>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    for_rows(x.size(0), n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * xs, wp, n, mp[r], float(eps), yp + r * n);
    });
  });
  return y;
}

// GemmaRMSNorm: y = (x / sqrt(mean(x^2) + eps)) * multiplier, all in float32 (the float32
// multiplier 1 + w), cast to x's dtype once at the end: transformers' Gemma order, and the
// same values as rms_norm(x.float(), multiplier).to(x.dtype) without the two conversions.
at::Tensor gemma_rms_norm(const at::Tensor& x, const at::Tensor& multiplier, double eps) {
  check_rows(x, "gemma_rms_norm");
  TORCH_CHECK(multiplier.scalar_type() == at::kFloat && multiplier.is_contiguous() &&
                  multiplier.numel() == x.size(1),
              "gemma_rms_norm: multiplier must be contiguous float32 [hidden]");
  at::Tensor y = at::empty({x.size(0), x.size(1)}, x.options());
  const at::Tensor ms = mean_squares(x);
  const int64_t n = x.size(1), xs = x.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "gemma_rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const float* mp = ms.data_ptr<float>();
    const float* wp = multiplier.data_ptr<float>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    for_rows(x.size(0), n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float inv = 1.0f / std::sqrt(mp[r] + float(eps));
        for (int64_t j = 0; j < n; ++j)
          yp[r * n + j] = static_cast<scalar_t>(static_cast<float>(xp[r * xs + j]) * inv * wp[j]);
      }
    });
  });
  return y;
}

// (norm(x + residual), x + residual): the residual stream and the next block's input.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  check_rows(x, "add_rms_norm");
  check_rows(residual, "add_rms_norm");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.dtype() == x.dtype(),
              "add_rms_norm: residual must match x");
  const int64_t n = x.size(1);
  at::Tensor sum = at::empty({x.size(0), n}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* rp = residual.data_ptr<scalar_t>();
    scalar_t* sp = sum.data_ptr<scalar_t>();
    // The strides are read once: Tensor::stride() in the loop kept it scalar, ~10x slower.
    const int64_t xs = x.stride(0), rs = residual.stride(0);
    for_rows(x.size(0), n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* a = xp + r * xs;
        const scalar_t* b = rp + r * rs;
        scalar_t* out = sp + r * n;
        for (int64_t j = 0; j < n; ++j) out[j] = a[j] + b[j];
      }
    });
  });
  return {rms_norm(sum, weight, eps), sum};
}

// Neox rotary, in place: x [T, H, D] (a view: any token and head strides, unit inner stride),
// cos/sin [T, 1, D/2] contiguous. (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
void rotary_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.size(2) % 2 == 0,
              "rotary_: expected x [T, H, D] with unit stride and D even");
  const int64_t t = x.size(0), h = x.size(1), half = x.size(2) / 2;
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == t * half &&
                  sin.numel() == t * half && cos.dtype() == x.dtype() && sin.dtype() == x.dtype(),
              "rotary_: cos and sin must be contiguous [T, 1, D/2] in x's dtype");
  const int64_t ts = x.stride(0), hs = x.stride(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary_", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* sp = sin.data_ptr<scalar_t>();
    for_rows(t, h * half * 2, [&](int64_t t0, int64_t t1) {
      for (int64_t i = t0; i < t1; ++i)
        for (int64_t k = 0; k < h; ++k) {
          scalar_t* a = xp + i * ts + k * hs;
          rotate_row(a, a + half, cp + i * half, sp + i * half, half);
        }
    });
  });
}

// silu(gate) * up for gate_up [T, 2I] -> [T, I].
at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "silu_and_mul");
  const int64_t t = gate_up.size(0), n = gate_up.size(1) / 2, gs = gate_up.stride(0);
  at::Tensor y = at::empty({t, n}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* g = gate_up.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    for_rows(t, n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) swiglu_row(g + r * gs, g + r * gs + n, n, yp + r * n);
    });
  });
  return y;
}

// k_cache[loc[i]] = k[i], v_cache[loc[i]] = v[i]: caches [S, H, D] contiguous, k/v [T, H, D]
// with unit strides inside a token (the qkv projection's views), loc int64 [T].
void store_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& loc, const at::Tensor& k,
              const at::Tensor& v) {
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k.dtype() == k_cache.dtype() &&
                  v.dtype() == v_cache.dtype() && loc.dtype() == at::kLong && loc.is_contiguous(),
              "store_kv: caches must be contiguous, k/v in their dtype, loc int64");
  const int64_t t = loc.numel(), row = k_cache.size(1) * k_cache.size(2), slots = k_cache.size(0);
  TORCH_CHECK(k.numel() == t * row && v.numel() == t * row, "store_kv: k/v do not fit loc");
  TORCH_CHECK(k.stride(2) == 1 && k.stride(1) == k.size(2) && v.stride(2) == 1 &&
                  v.stride(1) == v.size(2),
              "store_kv: each token's heads must be contiguous");
  const int64_t* lp = loc.data_ptr<int64_t>();
  const int64_t bytes = row * k.element_size();
  auto* kc = static_cast<char*>(k_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const auto* kp = static_cast<const char*>(k.data_ptr());
  const auto* vp = static_cast<const char*>(v.data_ptr());
  const int64_t ks = k.stride(0) * k.element_size(), vs = v.stride(0) * v.element_size();
  for (int64_t i = 0; i < t; ++i) {
    TORCH_CHECK(lp[i] >= 0 && lp[i] < slots, "store_kv: slot ", lp[i], " outside the pool");
    std::memcpy(kc + lp[i] * bytes, kp + i * ks, bytes);
    std::memcpy(vc + lp[i] * bytes, vp + i * vs, bytes);
  }
}

}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("gemma_rms_norm(Tensor x, Tensor multiplier, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rotary_(Tensor(a!) x, Tensor cos, Tensor sin) -> ()");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def("store_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc, Tensor k, Tensor v) -> ()");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) {
  m.impl("rms_norm", radixrt::rms_norm);
  m.impl("gemma_rms_norm", radixrt::gemma_rms_norm);
  m.impl("add_rms_norm", radixrt::add_rms_norm);
  m.impl("rotary_", radixrt::rotary_);
  m.impl("silu_and_mul", radixrt::silu_and_mul);
  m.impl("store_kv", radixrt::store_kv);
}
