// Gemma 3's layer stack in one call on the CPU: SandwichNormLayer of QKNormAttention and a
// GeGLU GatedMLP (radixrt/layers/decoder.py, models/gemma3.py), with GemmaRMSNorm's float32
// multipliers (1 + w). The same ops as the modules in the same order, so the output is theirs
// bit for bit (tests/unit/test_native_stack.py); models/native_stack.py decides when a step
// takes it. At batch 1 the modules are ~30 Python-level calls a layer.
//
// Layer i (the residual add deferred into the next norm, as the modules do):
//   x, r = norm_in(h) and h (i = 0), else norm_in(h + r) and h + r
//   qkv = x W_qkv; q, k each head normed (q_norm, k_norm); rotary by the layer's tables
//   store k, v; a = paged attention (a sliding window for a windowed layer) W_o
//   x, r = norm_pre_ffw(norm_post_attn(a) + r);  h = norm_post_ffw(gelu_tanh(x W_g) * x W_u W_d)
// and at the end the final norm of h + r.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "layer_parts.h"
#include "ops.h"

namespace {

using radixrt_layers::Copy;
using radixrt_layers::project;
using radixrt_layers::Rows;

// norm_in, qkv, q_norm, k_norm, o, norm_post_attn, norm_pre_ffw, gate_up, norm_post_ffw, down
constexpr int64_t kWeightsPerLayer = 10;
constexpr int64_t kKindsPerLayer = radixrt_layers::kProjections;

// GemmaRMSNorm.forward.
at::Tensor norm(const at::Tensor& x, const at::Tensor& multiplier, double eps) {
  return radixrt::gemma_rms_norm(x, multiplier, eps);
}

// GemmaRMSNorm.add_and_norm: (norm(x + residual), x + residual).
std::tuple<at::Tensor, at::Tensor> add_norm(const at::Tensor& x, const at::Tensor& residual,
                                            const at::Tensor& multiplier, double eps) {
  if (x.scalar_type() == at::kFloat) return radixrt::add_rms_norm(x, residual, multiplier, eps);
  at::Tensor sum = x + residual;
  return {norm(sum, multiplier, eps), sum};
}

// The step's batch as attention sees it: full attention (its shared-prefix cascades left out
// of kv_indices) and the sliding window (every sequence's whole key list, no cascade).
struct Step {
  const at::Tensor& out_cache_loc;
  const at::Tensor& qo_indptr;
  const at::Tensor& kv_indptr;
  const at::Tensor& kv_indices;
  at::TensorList cascade_rows;
  at::TensorList cascade_slots;
  const at::Tensor& window_kv_indptr;
  const at::Tensor& window_kv_indices;
  int64_t hq, hkv, head_dim;
  Rows rows;
  double scale, eps;
};

// QKNormAttention.forward (GemmaRMSNorm q/k norms) with the torch backend's native path.
at::Tensor attention(const Step& s, const at::Tensor& x, const at::Tensor* w, const int64_t* kinds,
                     const Copy* copies, const at::Tensor& cos, const at::Tensor& sin,
                     int64_t window, const at::Tensor& k_cache, const at::Tensor& v_cache) {
  const at::Tensor qkv = project(x, w[1], kinds[0], s.rows, copies[0]);
  const int64_t t = qkv.size(0), d = s.head_dim, q_size = s.hq * d, kv_size = s.hkv * d;
  const at::Tensor qk_raw = qkv.narrow(1, 0, q_size + kv_size).view({t, s.hq + s.hkv, d});
  const at::Tensor q_normed = norm(qk_raw.narrow(1, 0, s.hq).reshape({-1, d}), w[2], s.eps);
  const at::Tensor k_normed = norm(qk_raw.narrow(1, s.hq, s.hkv).reshape({-1, d}), w[3], s.eps);
  const at::Tensor qk = at::cat({q_normed.view({t, s.hq, d}), k_normed.view({t, s.hkv, d})}, 1);
  radixrt::rotary_(qk, cos, sin);
  const at::Tensor q = qk.narrow(1, 0, s.hq);
  const at::Tensor k = qk.narrow(1, s.hq, s.hkv);
  const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({t, s.hkv, d});
  radixrt::store_kv(k_cache, v_cache, s.out_cache_loc, k, v);
  at::Tensor out;
  if (window > 0) {
    out = std::get<0>(radixrt::paged_attention(q, k_cache, v_cache, s.qo_indptr,
                                               s.window_kv_indptr, s.window_kv_indices, s.scale,
                                               window));
  } else {
    out = std::get<0>(radixrt::paged_attention(q, k_cache, v_cache, s.qo_indptr, s.kv_indptr,
                                               s.kv_indices, s.scale, 0, s.cascade_rows,
                                               s.cascade_slots));
  }
  return project(out.reshape({t, q_size}), w[4], kinds[1], s.rows, copies[1]);
}

// GatedMLP with gelu_tanh_and_mul.
at::Tensor mlp(const Step& s, const at::Tensor& x, const at::Tensor* w, const int64_t* kinds,
               const Copy* copies) {
  const at::Tensor gate_up = project(x, w[7], kinds[2], s.rows, copies[2]);
  const int64_t n = gate_up.size(1) / 2;
  const at::Tensor act = at::gelu(gate_up.narrow(1, 0, n), "tanh") * gate_up.narrow(1, n, n);
  return project(act, w[9], kinds[3], s.rows, copies[3]);
}

void check_lists(at::TensorList weights, at::IntArrayRef kinds, at::TensorList copies,
                 at::TensorList copy_scales, at::TensorList k_caches, at::TensorList v_caches,
                 at::IntArrayRef windows) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(v_caches.size()) == layers &&
                  static_cast<int64_t>(windows.size()) == layers,
              "sandwich_layers: one k cache, v cache and window per layer, at least one layer");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kWeightsPerLayer + 1,
              "sandwich_layers: weights must be 10 per layer and the final norm's");
  TORCH_CHECK(static_cast<int64_t>(kinds.size()) == layers * kKindsPerLayer &&
                  copies.size() == kinds.size() && copy_scales.size() == kinds.size(),
              "sandwich_layers: kinds, dense copies and their scales must be 4 per layer");
  TORCH_CHECK(k_caches[0].dim() == 3, "sandwich_layers: caches must be [pool, Hkv, D]");
}

// hidden: the scaled embeddings [T, hidden]; cos/sin (global layers) and sliding_cos/sin
// (windowed layers) [T, 1, D/2] contiguous in hidden's dtype; windows[i]: layer i's window.
at::Tensor sandwich_layers(
    const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& sliding_cos, const at::Tensor& sliding_sin, at::TensorList weights,
    at::IntArrayRef kinds, at::TensorList dense_copies, at::TensorList copy_scales,
    at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& out_cache_loc,
    const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
    at::TensorList cascade_rows, at::TensorList cascade_slots, const at::Tensor& window_kv_indptr,
    const at::Tensor& window_kv_indices, at::IntArrayRef windows, int64_t num_heads, double eps,
    double scale, int64_t dense_from_rows, int64_t copy_from_rows, int64_t int8_rows) {
  check_lists(weights, kinds, dense_copies, copy_scales, k_caches, v_caches, windows);
  TORCH_CHECK(cascade_rows.size() == cascade_slots.size(),
              "sandwich_layers: one slot list per cascade's rows");
  const Step s{out_cache_loc,    qo_indptr,         kv_indptr,
               kv_indices,       cascade_rows,      cascade_slots,
               window_kv_indptr, window_kv_indices, num_heads,
               k_caches[0].size(1), k_caches[0].size(2),
               Rows{dense_from_rows, copy_from_rows, int8_rows}, scale, eps};
  at::Tensor h = hidden, residual, x;
  for (int64_t i = 0; i < static_cast<int64_t>(k_caches.size()); ++i) {
    const at::Tensor* w = weights.data() + i * kWeightsPerLayer;
    const int64_t* kind = kinds.data() + i * kKindsPerLayer;
    const auto copies = radixrt_layers::copies_of(dense_copies, copy_scales, i);
    const Copy* copy = copies.data();
    if (i == 0) {
      residual = h;
      x = norm(h, w[0], eps);
    } else {
      std::tie(x, residual) = add_norm(h, residual, w[0], eps);
    }
    const bool windowed = windows[i] > 0;
    const at::Tensor a = attention(s, x, w, kind, copy, windowed ? sliding_cos : cos,
                                   windowed ? sliding_sin : sin, windows[i], k_caches[i],
                                   v_caches[i]);
    std::tie(x, residual) = add_norm(norm(a, w[5], eps), residual, w[6], eps);
    h = norm(mlp(s, x, w, kind, copy), w[8], eps);
  }
  return std::get<0>(add_norm(h, residual, weights.back(), eps));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def(
      "sandwich_layers(Tensor hidden, Tensor cos, Tensor sin, Tensor sliding_cos, "
      "Tensor sliding_sin, Tensor[] weights, int[] kinds, Tensor[] dense_copies, "
      "Tensor[] copy_scales, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, "
      "Tensor out_cache_loc, Tensor qo_indptr, Tensor kv_indptr, Tensor kv_indices, "
      "Tensor[] cascade_rows, Tensor[] cascade_slots, Tensor window_kv_indptr, "
      "Tensor window_kv_indices, int[] windows, int num_heads, float eps, float scale, "
      "int dense_from_rows, int copy_from_rows, int int8_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) { m.impl("sandwich_layers", sandwich_layers); }
// bfloat16 dense copies are mkldnn tensors, whose dispatch key then picks the op's kernel.
TORCH_LIBRARY_IMPL(radixrt, MkldnnCPU, m) { m.impl("sandwich_layers", sandwich_layers); }
