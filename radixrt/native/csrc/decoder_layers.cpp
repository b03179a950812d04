// A decoder's whole layer stack in one call on the CPU, from the embeddings to the final norm.
// Through the modules (radixrt/layers/*.py) a layer is ~15 calls from Python (modules, views,
// ops), ~150 us at batch 1: a third of a 135M model's decode step. Here the same native ops
// (ops.h) run in the same order on the same tensors, so the output is the modules' bit for bit;
// radixrt/models/native_stack.py decides when a step can take this path.
//
// Layer i, as DecoderLayer does it (the residual add deferred into the next norm):
//   x, r = norm_in(h) and h (i = 0), else add_rms_norm(h, r)
//   qkv = x W_qkv (+ b, Qwen2); rotary on q and k in place; store k, v at the new tokens' slots
//   a = paged_attention(q), its shared prefixes (cascades) folded in first; a W_o
//   x, r = add_rms_norm(a, r);  h = silu_and_mul(x W_gate_up) W_down
// and at the end add_rms_norm(h, r) with the final norm's weight.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "layer_parts.h"
#include "ops.h"

namespace {

using radixrt_layers::Copy;
using radixrt_layers::project;
using radixrt_layers::Rows;

constexpr int64_t kWeightsPerLayer = 6;  // norm_in, qkv, o, norm_post, gate_up, down
constexpr int64_t kKindsPerLayer = radixrt_layers::kProjections;

// What every layer's attention shares: the batch's slots and index tables, and the shapes.
struct Step {
  const at::Tensor& cos;
  const at::Tensor& sin;
  const at::Tensor& out_cache_loc;
  const at::Tensor& qo_indptr;
  const at::Tensor& kv_indptr;
  const at::Tensor& kv_indices;
  at::TensorList cascade_rows;   // per shared prefix: the rows that attend to it
  at::TensorList cascade_slots;  // and its slots (left out of those rows' kv_indices)
  int64_t hq, hkv, head_dim;
  Rows rows;
  double scale;
};

// PackableLinear.linear with its bias (an empty tensor: none): dense_linear's own for a
// dense weight, else added after the packed matmul, as the module adds it (Qwen2's q/k/v).
at::Tensor project_biased(const at::Tensor& x, const at::Tensor& w, int64_t kind, Rows rows,
                          const Copy& copy, const at::Tensor& bias) {
  if (bias.numel() == 0) return project(x, w, kind, rows, copy);
  if (kind == radixrt_layers::kDense) return radixrt::dense_linear(x, w, bias);
  return at::add(project(x, w, kind, rows, copy), bias);
}

// RotaryAttention.forward with the torch backend's native path.
at::Tensor attention(const Step& s, const at::Tensor& x, const at::Tensor& w_qkv,
                     const at::Tensor& w_o, const int64_t* kinds, const Copy* copies,
                     const at::Tensor* biases, const at::Tensor& k_cache,
                     const at::Tensor& v_cache) {
  const at::Tensor qkv = project_biased(x, w_qkv, kinds[0], s.rows, copies[0], biases[0]);
  const int64_t t = qkv.size(0), q_size = s.hq * s.head_dim, kv_size = s.hkv * s.head_dim;
  const at::Tensor qk = qkv.narrow(1, 0, q_size + kv_size).view({t, s.hq + s.hkv, s.head_dim});
  radixrt::rotary_(qk, s.cos, s.sin);
  const at::Tensor q = qk.narrow(1, 0, s.hq);
  const at::Tensor k = qk.narrow(1, s.hq, s.hkv);
  const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({t, s.hkv, s.head_dim});
  radixrt::store_kv(k_cache, v_cache, s.out_cache_loc, k, v);
  const at::Tensor out = std::get<0>(radixrt::paged_attention(
      q, k_cache, v_cache, s.qo_indptr, s.kv_indptr, s.kv_indices, s.scale, 0, s.cascade_rows,
      s.cascade_slots));
  return project_biased(out.reshape({t, q_size}), w_o, kinds[1], s.rows, copies[1], biases[1]);
}

void check_lists(at::TensorList weights, at::IntArrayRef kinds, at::TensorList copies,
                 at::TensorList copy_scales, at::TensorList biases,
                 at::TensorList k_caches, at::TensorList v_caches) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(v_caches.size()) == layers,
              "decoder_layers: one k and one v cache per layer, at least one layer");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kWeightsPerLayer + 1,
              "decoder_layers: weights must be 6 per layer and the final norm's");
  TORCH_CHECK(static_cast<int64_t>(kinds.size()) == layers * kKindsPerLayer,
              "decoder_layers: kinds must be 4 per layer (qkv, o, gate_up, down)");
  TORCH_CHECK(copies.size() == kinds.size() && copy_scales.size() == kinds.size(),
              "decoder_layers: dense copies and their scales must be 4 per layer");
  TORCH_CHECK(biases.size() == kinds.size(), "decoder_layers: biases must be 4 per layer");
  TORCH_CHECK(k_caches[0].dim() == 3, "decoder_layers: caches must be [pool, Hkv, D]");
}

// hidden: the embeddings [T, hidden]; cos/sin [T, 1, D/2] contiguous in hidden's dtype.
at::Tensor decoder_layers(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                          at::TensorList weights, at::IntArrayRef kinds,
                          at::TensorList dense_copies, at::TensorList copy_scales,
                          at::TensorList biases, at::TensorList k_caches,
                          at::TensorList v_caches, const at::Tensor& out_cache_loc,
                          const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                          const at::Tensor& kv_indices, at::TensorList cascade_rows,
                          at::TensorList cascade_slots, int64_t num_heads, double eps,
                          double scale, int64_t dense_from_rows, int64_t copy_from_rows,
                          int64_t int8_rows) {
  check_lists(weights, kinds, dense_copies, copy_scales, biases, k_caches, v_caches);
  TORCH_CHECK(cascade_rows.size() == cascade_slots.size(),
              "decoder_layers: one slot list per cascade's rows");
  const Step s{cos,       sin,
               out_cache_loc, qo_indptr,
               kv_indptr, kv_indices,
               cascade_rows, cascade_slots,
               num_heads, k_caches[0].size(1),
               k_caches[0].size(2), Rows{dense_from_rows, copy_from_rows, int8_rows},
               scale};
  at::Tensor h = hidden, residual, x;
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* w = weights.data() + i * kWeightsPerLayer;
    const int64_t* kind = kinds.data() + i * kKindsPerLayer;
    const auto copies = radixrt_layers::copies_of(dense_copies, copy_scales, i);
    const Copy* copy = copies.data();
    const at::Tensor* bias = biases.data() + i * kKindsPerLayer;
    if (i == 0) {
      residual = h;
      x = radixrt::rms_norm(h, w[0], eps);
    } else {
      std::tie(x, residual) = radixrt::add_rms_norm(h, residual, w[0], eps);
    }
    const at::Tensor a = attention(s, x, w[1], w[2], kind, copy, bias, k_caches[i], v_caches[i]);
    std::tie(x, residual) = radixrt::add_rms_norm(a, residual, w[3], eps);
    const at::Tensor gate_up = project_biased(x, w[4], kind[2], s.rows, copy[2], bias[2]);
    h = project_biased(radixrt::silu_and_mul(gate_up), w[5], kind[3], s.rows, copy[3], bias[3]);
  }
  return std::get<0>(radixrt::add_rms_norm(h, residual, weights.back(), eps));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def(
      "decoder_layers(Tensor hidden, Tensor cos, Tensor sin, Tensor[] weights, int[] kinds, "
      "Tensor[] dense_copies, Tensor[] copy_scales, Tensor[] biases, "
      "Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, Tensor out_cache_loc, Tensor qo_indptr, "
      "Tensor kv_indptr, Tensor kv_indices, Tensor[] cascade_rows, Tensor[] cascade_slots, "
      "int num_heads, float eps, float scale, "
      "int dense_from_rows, int copy_from_rows, int int8_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) { m.impl("decoder_layers", decoder_layers); }
// bfloat16 dense copies are mkldnn tensors, whose dispatch key then picks the op's kernel.
TORCH_LIBRARY_IMPL(radixrt, MkldnnCPU, m) { m.impl("decoder_layers", decoder_layers); }
