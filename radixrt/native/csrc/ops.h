// radixrt's native CPU ops as C++ functions, for kernels that call others without going
// through the dispatcher (decoder_layers.cpp runs a whole layer stack this way). Each is also
// registered as torch.ops.radixrt.<name> by the file that defines it; see that file for what
// it computes and requires.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace radixrt {

// cpu_layers.cpp
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor gemma_rms_norm(const at::Tensor& x, const at::Tensor& multiplier, double eps);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);
void rotary_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
void store_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& loc, const at::Tensor& k,
              const at::Tensor& v);

// dense_linear.cpp (dense_linear is the op radixrt::dense_linear too)
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w,
                        const std::optional<at::Tensor>& bias = std::nullopt);
at::Tensor dense_copy_linear(const at::Tensor& x, const at::Tensor& dense);

// gguf_linear.cpp
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                       int64_t dense_from_rows, int64_t int8_rows);
at::Tensor gguf_dequantize(const at::Tensor& packed);
int64_t gguf_out_features(const at::Tensor& packed);

// w8a8_linear.cpp
at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& w_scale);

// paged_attention.cpp
std::tuple<at::Tensor, at::Tensor> paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                                   const at::Tensor& v_cache,
                                                   const at::Tensor& qo_indptr,
                                                   const at::Tensor& kv_indptr,
                                                   const at::Tensor& kv_indices, double scale,
                                                   int64_t window = 0,
                                                   at::TensorList cascade_rows = {},
                                                   at::TensorList cascade_slots = {});

}  // namespace radixrt
