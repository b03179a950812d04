// y = x W.T (+ b) for a dense float32 weight on the CPU, through oneDNN's matmul (the op
// torch.ops.mkldnn._linear_pointwise) instead of aten's BLAS: torch's CPU build hands float32
// matmuls to MKL, which on an AMD EPYC with AVX-512 ran at half oneDNN's speed (oneDNN picks
// its kernels by the CPU's instruction sets, not its vendor). vLLM's CPU build does the same.
// radixrt/layers/linear.py calls the same op from Python, so both paths give the same bits.
#include <ATen/ATen.h>
#include <ATen/Config.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string_view>

#include "ops.h"

namespace {

using PointwiseFn = at::Tensor(const at::Tensor&, const at::Tensor&,
                               const std::optional<at::Tensor>&, std::string_view,
                               c10::List<std::optional<at::Scalar>>,
                               std::optional<std::string_view>);

at::Tensor linear_pointwise(const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<PointwiseFn>();
  return op.call(x, w, bias, "none", c10::List<std::optional<at::Scalar>>(), "");
}

}  // namespace

namespace radixrt {

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w,
                        const std::optional<at::Tensor>& bias) {
  if (!at::hasMKLDNN() || x.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat)
    return at::linear(x, w, bias);
  return linear_pointwise(x, w, bias);
}

// A packed layer's bfloat16 copy in oneDNN's layout (GGUFWeight.keep_dense), the same op and
// arguments as radixrt/layers/quantized.py's dense_copy_linear.
at::Tensor dense_copy_linear(const at::Tensor& x, const at::Tensor& dense) {
  return linear_pointwise(x, dense, std::nullopt);
}

}  // namespace radixrt
