// y = x W.T (+ b) for a dense weight on the CPU. float32 and bfloat16 run float_matmul.cpp's
// kernel: one order per output whatever the row count, so a request's bits never depend on its
// batch (a bfloat16 x and weight are widened, exactly, and y rounded once, as oneDNN's bf16
// matmul does). Only builds without AVX2 fall back to aten's linear.
// A packed layer's bfloat16 copy (GGUFWeight.keep_dense, an opt-out of that promise) runs
// oneDNN's matmul through torch.ops.mkldnn._linear_pointwise.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <string_view>

#include "ops.h"

namespace radixrt::gguf {
at::Tensor float_dense_matmul(const at::Tensor& x, const at::Tensor& w);  // float_matmul.cpp
bool float_matmul_supported();
}  // namespace radixrt::gguf

namespace radixrt {

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w,
                        const std::optional<at::Tensor>& bias) {
  const auto dtype = x.scalar_type();
  const bool ours = gguf::float_matmul_supported() && x.dim() == 2 && x.device().is_cpu() &&
                    (dtype == at::kFloat || dtype == at::kBFloat16) && w.scalar_type() == dtype &&
                    w.dim() == 2 && x.size(1) == w.size(1);
  if (!ours) return at::linear(x, w, bias);
  at::Tensor y = gguf::float_dense_matmul(x.to(at::kFloat).contiguous(), w.contiguous());
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y.to(dtype);
}

at::Tensor dense_copy_linear(const at::Tensor& x, const at::Tensor& dense) {
  using PointwiseFn = at::Tensor(const at::Tensor&, const at::Tensor&,
                                 const std::optional<at::Tensor>&, std::string_view,
                                 c10::List<std::optional<at::Scalar>>,
                                 std::optional<std::string_view>);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<PointwiseFn>();
  return op.call(x, dense, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), "");
}

}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def("dense_linear(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) { m.impl("dense_linear", radixrt::dense_linear); }
