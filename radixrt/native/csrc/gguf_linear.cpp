// y = x @ W.T for W kept in llama.cpp's GGUF block types (gguf_types.h), read as stored.
//
// A packed weight is one uint8 tensor: a header, then each part's rows (gguf_layout.cpp). A
// merged projection whose pieces have different types (Q4_K_M) is one weight of several parts.
// Narrow inputs: the int8 kernel (gguf_dot8.cpp) or the float one here, which widens each
// sub-block in registers for up to 8 (AVX-512) or 4 (AVX2) rows. Wide inputs: the int8 kernel,
// or tiles widened once (float_matmul.cpp), in the narrow kernel's order.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_layout.h"
#include "gguf_types.h"
#include "ops.h"

#include "gguf_widen.h"

namespace radixrt::gguf {
// gguf_dot8.cpp; x float32 or bfloat16 [M, K] contiguous, y in x's dtype.
at::Tensor int8_linear(const at::Tensor& x, const Layout& l);
at::Tensor float_wide_linear(const at::Tensor& x, const Layout& l);  // float_matmul.cpp
}  // namespace radixrt::gguf

namespace {

using namespace radixrt::gguf;
using namespace radixrt::gguf::floats;

#ifdef RADIXRT_AVX512
constexpr int64_t kRowsPerPass = 8;  // input rows sharing each widened sub-block
#else
constexpr int64_t kRowsPerPass = 4;
#endif

// ---- Narrow inputs -------------------------------------------------------------------------
#ifdef RADIXRT_AVX2
// Output columns [n, n + C) of one part for M input rows (x [M, K], y row stride ldy), each a
// chain in gguf_widen.h's order. C columns at once: with one input row, one chain would be
// a row of fma latencies; M * C chains keep the units busy.
template <int M, int C, int64_t T>
inline void narrow_cols(const float* x, const Part& p, int64_t K, int64_t n, float* y,
                        int64_t ldy) {
  constexpr int64_t kW = Traits<T>::weights, kB = Traits<T>::bytes, kSubs = kW / 32;
  Vec acc[M][C];
  for (auto& r : acc)
    for (auto& c : r) c = vzero();
  for (int64_t b = 0; b < K / kW; ++b)
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = p.data + (n + c) * p.row_bytes + b * kB;
      prefetch_ahead(blk, kB);
      for (int s = 0; s < kSubs; ++s) {
        Vec w[kVecs];
        weights32<T>(blk, s, w);
        const float* xs = x + b * kW + s * 32;
        for (int v = 0; v < kVecs; ++v)
          for (int r = 0; r < M; ++r) acc[r][c] = vfma(w[v], xs + r * K + v * kLanes, acc[r][c]);
      }
    }
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + p.row0 + n + c] = vsum(acc[r][c]);
}

template <int M, int64_t T>
void narrow_rows(const float* x, const Part& p, int64_t K, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  constexpr int C = M >= 8 ? 1 : 8 / M;
  int64_t n = n0;
  for (; n + C <= n1; n += C) narrow_cols<M, C, T>(x, p, K, n, y, ldy);
  for (; n < n1; ++n) narrow_cols<M, 1, T>(x, p, K, n, y, ldy);
}
#else
template <int M, int64_t T>
void narrow_rows(const float* x, const Part& p, int64_t K, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  constexpr int64_t kW = Traits<T>::weights, kB = Traits<T>::bytes, kSubs = kW / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = p.data + n * p.row_bytes;
    float acc[M] = {};
    float wf[32];
    for (int64_t b = 0; b < K / kW; ++b)
      for (int s = 0; s < kSubs; ++s) {
        Sub o;
        decode_sub<T>(row + b * kB, s, o);
        sub_to_floats(o, wf);
        for (int r = 0; r < M; ++r)
          for (int j = 0; j < 32; ++j) acc[r] += wf[j] * x[r * K + b * kW + s * 32 + j];
      }
    for (int r = 0; r < M; ++r) y[r * ldy + p.row0 + n] = acc[r];
  }
}
#endif

using RowsFn = void (*)(const float*, const Part&, int64_t, int64_t, int64_t, float*, int64_t);

template <int64_t T>
RowsFn rows_fn_of(int64_t m) {
  return up_to<kRowsPerPass>(m, []<int M>() { return &narrow_rows<M, T>; });
}

// Few input rows (decode steps): kRowsPerPass input rows at a time share each widened
// sub-block, and the threads split each part's output columns.
at::Tensor narrow_linear(const at::Tensor& x, const Layout& l) {
  const int64_t M = x.size(0), K = l.K;
  at::Tensor y = at::empty({M, l.N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (const Part& p : l.parts)
    for (int64_t r0 = 0; r0 < M; r0 += kRowsPerPass) {
      RowsFn fn = nullptr;
      dispatch(p.type, [&]<int64_t T>() { fn = rows_fn_of<T>(std::min(kRowsPerPass, M - r0)); });
      at::parallel_for(0, p.rows, 16, [&](int64_t n0, int64_t n1) {
        fn(xp + r0 * K, p, K, n0, n1, yp + r0 * l.N, l.N);
      });
    }
  return y;
}

// ---- Wide bfloat16 inputs ------------------------------------------------------------------
// Only under --cpu-gguf-int8-rows N >= 1 (a bfloat16 step wider than N rows) on a CPU with
// bf16 matmul units: there oneDNN's bfloat16 matmul is ~2x float32's, and a row's bits depend
// on its batch (docs/determinism.md). Each thread takes whole tiles of weight rows: it expands
// a tile, rounds it to bfloat16 (the weights `--quantization none` would hold) and multiplies
// it (a one-thread oneDNN call) while it is still in its core's cache. A
// tile is 1-2 MiB of floats (growing with M: each call repacks x and has its set-up cost);
// the tile count is a multiple of the thread count, so the threads get equal work.
#if defined(__AVX512BF16__) || defined(__AMX_BF16__)
at::Tensor bf16_wide_linear(const at::Tensor& x, const Layout& l) {
  const int64_t M = x.size(0), K = l.K, N = l.N;
  const int64_t threads = at::get_num_threads();
  const int64_t tile_bytes = std::clamp<int64_t>(M * 2048, 1 << 20, 2 << 20);
  const int64_t target = std::max<int64_t>(8, tile_bytes / (K * 4));
  const int64_t tiles = ((N + target - 1) / target + threads - 1) / threads * threads;
  const int64_t tile = ((N + tiles - 1) / tiles + 7) / 8 * 8;
  at::Tensor y = at::empty({M, N}, x.options());
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, (N + tile - 1) / tile, 1, [&](int64_t t0, int64_t t1) {
    // Worker threads do not inherit the caller's inference mode, without which writing into
    // y (an inference tensor when the engine made it) is refused.
    c10::InferenceMode mode(inference);
    at::Tensor widened = at::empty({tile, K}, x.options().dtype(at::kFloat));
    at::Tensor rounded = at::empty({tile, K}, x.options());
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * tile, rows = std::min(tile, N - n0);
      at::Tensor wt = widened.narrow(0, 0, rows);
      dequantize_rows(l, n0, rows, wt.data_ptr<float>());
      wt = rounded.narrow(0, 0, rows).copy_(wt);
      y.narrow(1, n0, rows).copy_(at::linear(x, wt));
    }
  });
  return y;
}
#endif

}  // namespace

namespace radixrt {

int64_t gguf_out_features(const at::Tensor& packed) { return read_layout(packed).N; }

at::Tensor gguf_dequantize(const at::Tensor& packed) {
  const Layout l = read_layout(packed);
  require_rows(l, "gguf_dequantize");
  at::Tensor out = at::empty({l.N, l.K}, packed.options().dtype(at::kFloat));
  at::parallel_for(0, l.N, 64, [&](int64_t n0, int64_t n1) {
    dequantize_rows(l, n0, n1 - n0, out.data_ptr<float>() + n0 * l.K);
  });
  return out;
}

// Rows `ids` of the weight as float32 [T, K]: a packed token embedding's lookup. A part that
// kept only its tiles (a tied embedding's, of a type untile_row reads) gives each row's blocks
// back from them first: the same bytes, so the same floats.
at::Tensor gguf_rows(const at::Tensor& packed, const at::Tensor& ids, int64_t in_features) {
  const Layout l = read_layout(packed);
  for (const Part& p : l.parts)  // tiles alone of a type untile_row cannot read: refused
    if (p.data == nullptr && !untile_supported(p.type)) require_rows(l, "gguf_rows");
  TORCH_CHECK(in_features == l.K, "gguf_rows: the weight has ", l.K, " features, not ", in_features);
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "gguf_rows: ids must be int64 [T]");
  const at::Tensor idx = ids.contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  at::Tensor out = at::empty({idx.numel(), l.K}, packed.options().dtype(at::kFloat));
  std::vector<uint8_t> row;
  for (int64_t t = 0; t < idx.numel(); ++t) {
    const int64_t n = ip[t];
    TORCH_CHECK(n >= 0 && n < l.N, "gguf_rows: id ", n, " out of range [0, ", l.N, ")");
    for (const Part& p : l.parts) {
      if (n < p.row0 || n >= p.row0 + p.rows) continue;
      const uint8_t* data = p.data ? p.data + (n - p.row0) * p.row_bytes : nullptr;
      if (data == nullptr) {
        row.resize(l.K / block_weights(p.type) * block_bytes(p.type));
        untile_row(p, l.K, n - p.row0, row.data());
        data = row.data();
      }
      dispatch(p.type, [&]<int64_t T>() { dequantize_row<T>(data, l.K, out.data_ptr<float>() + t * l.K); });
    }
  }
  return out;
}

// x [M, K] float32 or bfloat16 -> [M, N] in x's dtype. Steps of up to int8_rows rows, however
// wide, round x to int8 and sum in integers (gguf_dot8.cpp), as llama.cpp does. Other steps
// multiply x as it is in float32 (a bfloat16 x widened, the result rounded), in one order
// whatever their width (gguf_widen.h): fewer than dense_from_rows rows widen each sub-block in
// registers; more widen tiles of weights once per call (float_matmul.cpp). out_features
// repeats the header's N, so that torch.compile's fake op knows the shape.
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                       int64_t dense_from_rows, int64_t int8_rows) {
  TORCH_CHECK((x.dtype() == at::kFloat || x.dtype() == at::kBFloat16) && x.dim() == 2,
              "gguf_linear: x must be float32 or bfloat16 [M, K], got ", x.dtype(), " of ",
              x.dim(), " dims");
  const Layout l = read_layout(packed);
  TORCH_CHECK(x.size(1) == l.K, "gguf_linear: x has ", x.size(1), " features, the weight ", l.K);
  TORCH_CHECK(out_features == l.N, "gguf_linear: the weight has ", l.N, " rows, not ", out_features);
  const bool int8 = x.size(0) <= int8_rows && gguf::int8_supported();
  if (!int8) require_rows(l, "gguf_linear with float activations");
#ifdef RADIXRT_AVX2
  const bool wide = !int8 && x.size(0) >= dense_from_rows;
#else
  const bool wide = false;  // the narrow kernel serves every width, in its one order
#endif
#if defined(__AVX512BF16__) || defined(__AMX_BF16__)
  if (wide && x.scalar_type() == at::kBFloat16) return bf16_wide_linear(x.contiguous(), l);
#endif
  if (int8) return gguf::int8_linear(x.contiguous(), l);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const at::Tensor y = wide ? gguf::float_wide_linear(xf, l) : narrow_linear(xf, l);
  return y.to(x.scalar_type());
}

}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def(
      "gguf_linear(Tensor x, Tensor packed, int out_features, int dense_from_rows, "
      "int int8_rows) -> Tensor");
  m.def("gguf_dequantize(Tensor packed) -> Tensor");
  m.def("gguf_rows(Tensor packed, Tensor ids, int in_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) {
  m.impl("gguf_linear", radixrt::gguf_linear);
  m.impl("gguf_dequantize", radixrt::gguf_dequantize);
  m.impl("gguf_rows", radixrt::gguf_rows);
}
