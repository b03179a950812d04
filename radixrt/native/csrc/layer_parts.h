// What the native layer stacks (decoder_layers.cpp, sandwich_layers.cpp) share: a projection
// by dense or packed weight, as the modules' PackableLinear computes it.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>

#include "ops.h"

namespace radixrt_layers {

constexpr int64_t kDense = -1;  // a projection's kind: a dense [out, in] weight

// A packed projection's copy for wide inputs (GGUFWeight.keep_dense): a bfloat16 mkldnn
// tensor, or int8 codes with their per-channel scales (W8A8); empty tensors mean none.
struct Copy {
  const at::Tensor& weight;
  const at::Tensor& scale;
};

// y = x W.T for a dense weight (F.linear's op) or a packed GGUF weight (gguf_linear.cpp);
// from copy_rows rows on a bf16 x takes the blocks' copy where there is one, as
// GGUFWeight.forward does.
struct Rows {
  int64_t dense, copy, int8;  // DENSE_FROM_ROWS, COPY_FROM_ROWS, INT8_ROWS (quantized.py)
};

inline at::Tensor project(const at::Tensor& x, const at::Tensor& w, int64_t kind, Rows rows,
                          const Copy& copy) {
  if (kind == kDense) return radixrt::dense_linear(x, w);
  if (copy.weight.numel() > 0 && x.size(0) >= rows.copy && x.scalar_type() == at::kBFloat16) {
    if (copy.weight.is_mkldnn()) return radixrt::dense_copy_linear(x, copy.weight);
    return radixrt::w8a8_linear(x, copy.weight, copy.scale);
  }
  return radixrt::gguf_linear(x, w, radixrt::gguf_out_features(w), rows.dense, rows.int8);
}

constexpr int64_t kProjections = 4;  // per layer: qkv, o, gate_up, down

// Layer `layer`'s projections' copies, out of the stacks' per-projection lists.
inline std::array<Copy, kProjections> copies_of(at::TensorList dense, at::TensorList scales,
                                                int64_t layer) {
  const int64_t p = layer * kProjections;
  return {{{dense[p], scales[p]},
           {dense[p + 1], scales[p + 1]},
           {dense[p + 2], scales[p + 2]},
           {dense[p + 3], scales[p + 3]}}};
}

}  // namespace radixrt_layers
