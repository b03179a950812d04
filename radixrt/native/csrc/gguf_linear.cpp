// y = x @ W.T for W kept in llama.cpp's GGUF block types (gguf_types.h), read as stored.
//
// A packed weight is one uint8 tensor: a header, then each part's rows (gguf_layout.cpp). A
// merged projection whose pieces have different types (Q4_K_M) is one weight of several parts.
// Narrow inputs: the int8 kernel (gguf_dot8.cpp) or the float one here, which widens each
// sub-block in registers for up to 8 (AVX-512) or 4 (AVX2) rows. Wide inputs: tiles expanded
// for oneDNN's matmul, or the int8 kernel.
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

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "gguf_codes.h"
#define RADIXRT_AVX2 1
#if defined(__AVX512F__)
#define RADIXRT_AVX512 1
#endif
#endif

namespace radixrt::gguf {
at::Tensor int8_linear(const at::Tensor& x, const Layout& l);  // gguf_dot8.cpp; x float32 [M, K]
}  // namespace radixrt::gguf

namespace {

using namespace radixrt::gguf;

#ifdef RADIXRT_AVX512
constexpr int64_t kRowsPerPass = 8;  // input rows sharing each widened sub-block
#else
constexpr int64_t kRowsPerPass = 4;
#endif

// ---- Sub-blocks as floats ------------------------------------------------------------------
// w = a q + b per 16 weights; fma rounds once, as gguf-py's product-then-sum does (a q exact).
void sub_to_floats(const Sub& o, float* out) {
  for (int j = 0; j < 32; ++j)
    out[j] = __builtin_fmaf(o.a[j / 16], static_cast<float>(o.q[j]), o.b[j / 16]);
}

#ifdef RADIXRT_AVX512
// 4-bit types: the 16 values a code can stand for form a table (a * iota + b, or a times
// IQ4's non-linear values) that each code indexes with one permute, which reads only an
// index's low 4 bits: no mask, and no int-to-float conversion per weight.
template <int64_t T>
constexpr bool kNibbleTable = T == Q4_0 || T == Q4_1 || T == Q4_K || T == IQ4_NL || T == IQ4_XS;

template <int64_t T>
inline void table_weights32(const uint8_t* blk, int s, __m512 w[2]) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  Codes c;
  codes<T>(blk, s, c);  // for its scales; the compiler drops the unused codes
  __m512 table;
  if constexpr (T == IQ4_NL || T == IQ4_XS) {
    const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(
        reinterpret_cast<const uint8_t*>(kIQ4Values))));
    table = _mm512_mul_ps(_mm512_set1_ps(c.a[0]), values);
  } else {
    const float b = T == Q4_0 ? -8.0f * c.a[0] : c.b[0];  // exact: a power-of-two multiple
    table = _mm512_fmadd_ps(_mm512_set1_ps(c.a[0]), iota, _mm512_set1_ps(b));
  }
  if constexpr (T == Q4_K) {  // 32 bytes, one nibble each
    const uint8_t* qs = blk + 16 + 32 * (s / 2);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_cvtepu8_epi32(load16(qs + 16 * h));
      w[h] = _mm512_permutexvar_ps(s % 2 ? _mm512_srli_epi32(q, 4) : q, table);
    }
  } else {  // 16 bytes: low nibbles, then high ones
    const int offset = T == Q4_1 ? 4 : T == IQ4_XS ? 8 + 16 * s : 2;
    const __m512i q = _mm512_cvtepu8_epi32(load16(blk + offset));
    w[0] = _mm512_permutexvar_ps(q, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
  }
}

template <int64_t T>
inline void weights32(const uint8_t* blk, int s, __m512 w[2]) {
  if constexpr (kNibbleTable<T>) {
    table_weights32<T>(blk, s, w);
  } else {
    Codes c;
    codes<T>(blk, s, c);
    for (int h = 0; h < 2; ++h) {
      const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c.q[h]));
      w[h] = _mm512_fmadd_ps(_mm512_set1_ps(c.a[h]), q, _mm512_set1_ps(c.b[h]));
    }
  }
}
using Vec = __m512;
constexpr int kVecs = 2;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vfma(Vec a, const float* x, Vec acc) { return _mm512_fmadd_ps(a, _mm512_loadu_ps(x), acc); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(RADIXRT_AVX2)
template <int64_t T>
inline void weights32(const uint8_t* blk, int s, __m256 w[4]) {
  Codes c;
  codes<T>(blk, s, c);
  for (int i = 0; i < 4; ++i) {
    const __m128i q8 = i % 2 ? _mm_srli_si128(c.q[i / 2], 8) : c.q[i / 2];
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
    w[i] = _mm256_fmadd_ps(_mm256_set1_ps(c.a[i / 2]), q, _mm256_set1_ps(c.b[i / 2]));
  }
}
using Vec = __m256;
constexpr int kVecs = 4;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vfma(Vec a, const float* x, Vec acc) { return _mm256_fmadd_ps(a, _mm256_loadu_ps(x), acc); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline float vsum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// ---- Narrow inputs -------------------------------------------------------------------------
// Output columns [n0, n1) of one part for M input rows (x [M, K], y row stride ldy). Even and
// odd sub-blocks go to separate accumulators: with one input row, adds into a single one
// would be a chain of latencies through the whole weight row.
template <int M, int64_t T>
void narrow_rows(const float* x, const Part& p, int64_t K, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  constexpr int64_t kW = Traits<T>::weights, kB = Traits<T>::bytes, kSubs = kW / 32;
  const int64_t nb = K / kW;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = p.data + n * p.row_bytes;
#ifdef RADIXRT_AVX2
    Vec acc[2][M][kVecs];
    for (auto& parity : acc)
      for (auto& r : parity)
        for (auto& v : r) v = vzero();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * kB;
      prefetch_ahead(blk, kB);
      for (int s = 0; s < kSubs; ++s) {
        Vec w[kVecs];
        weights32<T>(blk, s, w);
        auto& into = acc[(b * kSubs + s) & 1];
        const float* xs = x + b * kW + s * 32;
        for (int r = 0; r < M; ++r)
          for (int v = 0; v < kVecs; ++v)
            into[r][v] = vfma(w[v], xs + r * K + v * (32 / kVecs), into[r][v]);
      }
    }
    for (int r = 0; r < M; ++r) {
      Vec total = vzero();
      for (int v = 0; v < kVecs; ++v) total = vadd(total, vadd(acc[0][r][v], acc[1][r][v]));
      y[r * ldy + p.row0 + n] = vsum(total);
    }
#else
    float acc[M] = {};
    float wf[32];
    for (int64_t b = 0; b < nb; ++b)
      for (int s = 0; s < kSubs; ++s) {
        Sub o;
        decode_sub<T>(row + b * kB, s, o);
        sub_to_floats(o, wf);
        for (int r = 0; r < M; ++r)
          for (int j = 0; j < 32; ++j) acc[r] += wf[j] * x[r * K + b * kW + s * 32 + j];
      }
    for (int r = 0; r < M; ++r) y[r * ldy + p.row0 + n] = acc[r];
#endif
  }
}

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

// ---- Dequantizing --------------------------------------------------------------------------
template <int64_t T>
void dequantize_row(const uint8_t* row, int64_t K, float* out) {
  constexpr int64_t kW = Traits<T>::weights, kB = Traits<T>::bytes;
  for (int64_t b = 0; b < K / kW; ++b)
    for (int s = 0; s < kW / 32; ++s) {
      float* dst = out + b * kW + s * 32;
#ifdef RADIXRT_AVX2
      Vec w[kVecs];
      weights32<T>(row + b * kB, s, w);
      for (int v = 0; v < kVecs; ++v) std::memcpy(dst + v * (32 / kVecs), &w[v], sizeof(Vec));
#else
      Sub o;
      decode_sub<T>(row + b * kB, s, o);
      sub_to_floats(o, dst);
#endif
    }
}

// Weight rows [n0, n0 + rows) of the whole layout as float32 into out (row stride K).
void dequantize_rows(const Layout& l, int64_t n0, int64_t rows, float* out) {
  for (const Part& p : l.parts) {
    const int64_t lo = std::max(n0, p.row0), hi = std::min(n0 + rows, p.row0 + p.rows);
    dispatch(p.type, [&]<int64_t T>() {
      for (int64_t n = lo; n < hi; ++n)
        dequantize_row<T>(p.data + (n - p.row0) * p.row_bytes, l.K, out + (n - n0) * l.K);
    });
  }
}

// ---- Wide inputs ---------------------------------------------------------------------------
// Each thread takes whole tiles of weight rows: it expands a tile into its own buffer and
// multiplies it (a one-thread oneDNN call, dense_linear.cpp) into those columns of y while it is
// still in its core's cache. A tile is 1-2 MiB of floats (growing with M: each call repacks x
// and has its set-up cost); the tile count is a multiple of the thread count, so the threads
// get equal work. A bfloat16 x gets its tile rounded to bfloat16 (the weights
// `--quantization none` would hold in that dtype), for bf16 matmul units' ~2x of float32.
at::Tensor wide_linear(const at::Tensor& x, const Layout& l) {
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
    at::Tensor rounded;
    if (x.scalar_type() != at::kFloat) rounded = at::empty({tile, K}, x.options());
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * tile, rows = std::min(tile, N - n0);
      at::Tensor wt = widened.narrow(0, 0, rows);
      dequantize_rows(l, n0, rows, wt.data_ptr<float>());
      if (rounded.defined()) wt = rounded.narrow(0, 0, rows).copy_(wt);
      y.narrow(1, n0, rows).copy_(radixrt::dense_linear(x, wt));
    }
  });
  return y;
}

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

// Rows `ids` of the weight as float32 [T, K]: a packed token embedding's lookup.
at::Tensor gguf_rows(const at::Tensor& packed, const at::Tensor& ids, int64_t in_features) {
  const Layout l = read_layout(packed);
  require_rows(l, "gguf_rows");
  TORCH_CHECK(in_features == l.K, "gguf_rows: the weight has ", l.K, " features, not ", in_features);
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "gguf_rows: ids must be int64 [T]");
  const at::Tensor idx = ids.contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  at::Tensor out = at::empty({idx.numel(), l.K}, packed.options().dtype(at::kFloat));
  for (int64_t t = 0; t < idx.numel(); ++t) {
    TORCH_CHECK(ip[t] >= 0 && ip[t] < l.N, "gguf_rows: id ", ip[t], " out of range [0, ", l.N, ")");
    dequantize_rows(l, ip[t], 1, out.data_ptr<float>() + t * l.K);
  }
  return out;
}

// x [M, K] float32 or bfloat16 -> [M, N] in x's dtype. Few rows run the sub-block kernel in
// float32 (a bfloat16 x is widened, the result rounded); many rows, wide_linear in x's dtype.
// out_features repeats the header's N, so that torch.compile's fake op knows the shape. Steps
// of up to int8_rows rows, however wide, round x to int8 and sum in integers (gguf_dot8.cpp),
// as llama.cpp does; other narrow steps run the float kernel, which multiplies x as it is.
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
  if (!int8 && x.size(0) >= dense_from_rows) {
#if !defined(__AVX512BF16__) && !defined(__AMX_BF16__)  // no bf16 units: oneDNN would emulate
    if (x.scalar_type() == at::kBFloat16)  // them at a third of float32's speed
      return wide_linear(x.to(at::kFloat).contiguous(), l).to(at::kBFloat16);
#endif
    return wide_linear(x.contiguous(), l);
  }
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const at::Tensor y = int8 ? gguf::int8_linear(xf, l) : narrow_linear(xf, l);
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
