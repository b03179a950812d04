// y = x @ W.T in float32 for many input rows, in one order per output whatever the row count:
// a GGUF weight's prefill chunks and wide batches (its narrow steps: gguf_linear.cpp), and
// every step of a dense weight (float32 or bfloat16). Each thread takes tiles of weight rows,
// widens a tile to floats once where it is not float32 already (the values the narrow kernel
// widens in registers), and multiplies it in register tiles of kRows input rows by kCols
// weight rows. Every output is one fma chain in gguf_widen.h's order, so a row's result is the
// same bits alone or in any batch. oneDNN's matmul, used before, sums in orders of its own
// that changed a float32 request's tokens with its batch (32 concurrent streams of a server
// against the same requests one at a time).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_widen.h"
#include "ops.h"

namespace radixrt::gguf {

#ifdef RADIXRT_AVX2
namespace {

using namespace floats;

constexpr int kRows = 4;  // input rows a register tile holds
#ifdef RADIXRT_AVX512
constexpr int kCols = 6;  // weight rows: kRows * kCols chains of 32 registers
#else
constexpr int kCols = 3;  // of 16 registers: 12 chains, 3 weight vectors, one of x
#endif
constexpr int64_t kTileBytes = 192 << 10;  // a thread's tile of widened weights, in its L2

// y[r][c] (row stride ldy) = the chain of x's row r (x [R, K]) with w's row c (w [C, K]).
template <int R, int C>
void register_tile(const float* x, const float* w, int64_t K, float* y, int64_t ldy) {
  Vec acc[R][C];
  for (auto& r : acc)
    for (auto& c : r) c = vzero();
  const int64_t whole = K / kLanes * kLanes;
  for (int64_t k = 0; k < whole; k += kLanes) {
    Vec wv[C];
    for (int c = 0; c < C; ++c) wv[c] = vload(w + c * K + k);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = vfma(wv[c], x + r * K + k, acc[r][c]);
  }
  if (whole < K) {  // zeros past K on both sides: the products there add exact zeros
    for (int r = 0; r < R; ++r) {
      float xs[kLanes] = {};
      std::memcpy(xs, x + r * K + whole, (K - whole) * sizeof(float));
      for (int c = 0; c < C; ++c)
        acc[r][c] = vfma(vload_first(w + c * K + whole, K - whole), xs, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = vsum(acc[r][c]);
}

using TileFn = void (*)(const float*, const float*, int64_t, float*, int64_t);

TileFn tile_fn(int64_t rows, int64_t cols) {
  return up_to<kRows>(rows, [&]<int R>() {
    return up_to<kCols>(cols, []<int C>() { return TileFn{&register_tile<R, C>}; });
  });
}

// x [M, K] times the weight rows w [cols, K] into y's columns (row stride ldy).
void multiply_tile(const float* x, int64_t M, int64_t K, const float* w, int64_t cols, float* y,
                   int64_t ldy) {
  const TileFn full = tile_fn(kRows, kCols);
  for (int64_t r = 0; r < M; r += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, M - r);
    for (int64_t c = 0; c < cols; c += kCols) {
      const int64_t n = std::min<int64_t>(kCols, cols - c);
      const TileFn fn = rows == kRows && n == kCols ? full : tile_fn(rows, n);
      fn(x + r * K, w + c * K, K, y + r * ldy + c, ldy);
    }
  }
}

// x float32 [M, K] contiguous -> y [M, N]: the threads split N into tiles of about kTileBytes
// of floats, a multiple of kCols rows each; widen(n0, cols, buffer) returns tile n0's rows as
// floats (in the buffer, or where they already are).
template <typename Widen>
at::Tensor tiled_matmul(const at::Tensor& x, int64_t N, Widen&& widen) {
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t per_tile = std::max<int64_t>(1, kTileBytes / (K * 4 * kCols)) * kCols;
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, (N + per_tile - 1) / per_tile, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buffer;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * per_tile, cols = std::min(per_tile, N - n0);
      multiply_tile(xp, M, K, widen(n0, cols, buffer), cols, yp + n0, N);
    }
  });
  return y;
}

}  // namespace

at::Tensor float_wide_linear(const at::Tensor& x, const Layout& l) {
  return tiled_matmul(x, l.N, [&](int64_t n0, int64_t cols, std::vector<float>& buffer) {
    buffer.resize(cols * l.K);
    dequantize_rows(l, n0, cols, buffer.data());
    return static_cast<const float*>(buffer.data());
  });
}

// x float32 [M, K], w float32 or bfloat16 [N, K], both contiguous -> float32 [M, N].
at::Tensor float_dense_matmul(const at::Tensor& x, const at::Tensor& w) {
  const int64_t K = w.size(1);
  if (w.scalar_type() == at::kFloat) {
    const float* wp = w.data_ptr<float>();
    return tiled_matmul(x, w.size(0), [&](int64_t n0, int64_t, std::vector<float>&) {
      return wp + n0 * K;
    });
  }
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  return tiled_matmul(x, w.size(0), [&](int64_t n0, int64_t cols, std::vector<float>& buffer) {
    buffer.resize(cols * K);
    const uint16_t* from = wp + n0 * K;
    for (int64_t i = 0; i < cols * K; ++i) {  // a bfloat16 is a float's upper half
      const uint32_t bits = static_cast<uint32_t>(from[i]) << 16;
      std::memcpy(&buffer[i], &bits, 4);
    }
    return static_cast<const float*>(buffer.data());
  });
}

bool float_matmul_supported() { return true; }
#else
at::Tensor float_wide_linear(const at::Tensor&, const Layout&) {
  TORCH_CHECK(false, "gguf_linear: the wide float kernel needs AVX2, FMA and F16C");
}
at::Tensor float_dense_matmul(const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "dense_linear: the float kernel needs AVX2, FMA and F16C");
}
bool float_matmul_supported() { return false; }
#endif

}  // namespace radixrt::gguf
