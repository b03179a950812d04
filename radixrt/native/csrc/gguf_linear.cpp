// y = x @ W.T for W stored as llama.cpp's GGUF blocks of 32 weights, read as they are stored:
//   Q4_1: [fp16 d][fp16 m][16 bytes: element j in the low nibble of byte j, j + 16 in the high
//          one], w = d * q + m, q in 0..15
//   Q8_0: [fp16 d][32 x int8 q], w = d * q
// Narrow inputs (decode steps) are memory-bound: each block's dot product is computed as
// d * sum(q * x) (+ m * sum(x) for Q4_1; with AVX-512 the weights come from a per-block table
// instead, see load_weights16), so the weights are never written out and a step reads 20 or
// 34 bytes per 32 weights, not 128. Wide inputs (big batches, prefill chunks) are
// compute-bound instead: there the weights are expanded to float32 a tile at a time and handed
// to oneDNN's matmul.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define RADIXRT_AVX2 1
#if defined(__AVX512F__)
#define RADIXRT_AVX512 1
#endif
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kQ4_1 = 0;  // the `kind` argument
constexpr int64_t kQ8_0 = 1;
// How far ahead of the block being read the narrow kernels prefetch: with it a batch-1 step's
// matmuls went from 15.6 to 8.7 ms on an AVX-512 Xeon (2-8 KiB measured alike), whose hardware
// prefetchers left these short row-by-row reads at ~3 GB/s a core.
constexpr int64_t kPrefetchBytes = 4096;
#ifdef RADIXRT_AVX512
constexpr bool kAvx512 = true;
constexpr int64_t kRowsPerPass = 8;  // input rows sharing each unpacked block (32 registers)
#else
constexpr bool kAvx512 = false;
constexpr int64_t kRowsPerPass = 4;
#endif

int64_t block_bytes(int64_t kind) { return kind == kQ4_1 ? 20 : 34; }

float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef RADIXRT_AVX2
  return _cvtsh_ss(h);
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}

#ifdef RADIXRT_AVX2
float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 32 quantized values of a block (without d, m) as four vectors of 8 floats, elements
// 8i..8i+7 in q[i]. Q4_1: each half of the code bytes widens straight from memory to 32-bit
// lanes, and a mask and a shift give its low nibbles (elements 0..15) and high ones (16..31);
// fewer shuffles than widening the nibbles from a 128-bit register (~1.35x on one core).
void load_q(const uint8_t* blk, int64_t kind, __m256 q[4]) {
  if (kind == kQ4_1) {
    const auto* lo8 = reinterpret_cast<const __m128i*>(blk + 4);   // code bytes 0..7
    const auto* hi8 = reinterpret_cast<const __m128i*>(blk + 12);  // code bytes 8..15
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(lo8));
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(hi8));
    const __m256i mask = _mm256_set1_epi32(0xF);
    q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, mask));
    q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, mask));
    q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  } else {
    const uint8_t* qs = blk + 2;
    for (int i = 0; i < 4; ++i) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * i));
      q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
  }
}

// A block's d (lane 0) and m (lane 1, Q4_1) in one conversion.
__m128 load_dm(const uint8_t* blk) {
  int32_t bits;
  std::memcpy(&bits, blk, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
}

// sum(q * x) over a block as 8 lanes: two chains of two, so the four products do not wait on
// each other.
__m256 block_dot(const __m256 q[4], const float* xb) {
  __m256 t0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
  __m256 t1 = _mm256_mul_ps(q[1], _mm256_loadu_ps(xb + 8));
  t0 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), t0);
  t1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), t1);
  return _mm256_add_ps(t0, t1);
}
#endif

// The 32 weights of one block as floats: d * q + m, a product then a sum, as the Python
// reference (quantized.dequantize) computes them, so the wide path multiplies by exactly those.
void dequantize_block(const uint8_t* blk, int64_t kind, float* out) {
  const float d = half_to_float(blk);
  const float m = kind == kQ4_1 ? half_to_float(blk + 2) : 0.0f;
#ifdef RADIXRT_AVX2
  __m256 q[4];
  load_q(blk, kind, q);
  for (int i = 0; i < 4; ++i) {
    const __m256 w = _mm256_mul_ps(_mm256_set1_ps(d), q[i]);
    _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(w, _mm256_set1_ps(m)));
  }
#else
  for (int j = 0; j < kBlock; ++j) {
    const int q = kind == kQ4_1 ? (blk[4 + j % 16] >> (j / 16 * 4)) & 0xF
                                : static_cast<int8_t>(blk[2 + j]);
    out[j] = d * static_cast<float>(q) + m;
  }
#endif
}

void dequantize_rows(const uint8_t* w, int64_t kind, int64_t nb, int64_t rows, float* out) {
  for (int64_t i = 0; i < rows * nb; ++i)
    dequantize_block(w + i * block_bytes(kind), kind, out + i * kBlock);
}

#ifdef RADIXRT_AVX512
// One block's 32 weights as two vectors of 16 floats (elements 0..15, 16..31). Q4_1: the 16
// values d * q + m form a table that each code indexes with one permute (which reads only an
// index's low 4 bits: the low nibbles need no mask), so the weights cost two permutes instead
// of four int to float conversions, and m needs no separate term. d * q is exact in float32
// (11 by 4 significant bits), so the table holds the reference's weights exactly, fused or
// not. Q8_0: the codes widened, converted, scaled (d * q exact likewise).
template <int64_t kind>
void load_weights16(const uint8_t* blk, __m512 w[2]) {
  int32_t dm_bits;
  std::memcpy(&dm_bits, blk, 4);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));  // d, m (Q4_1)
  const __m512 d = _mm512_broadcastss_ps(dm);
  if constexpr (kind == kQ4_1) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 table = _mm512_add_ps(_mm512_mul_ps(d, iota),
                                       _mm512_broadcastss_ps(_mm_movehdup_ps(dm)));
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + 4)));
    w[0] = _mm512_permutexvar_ps(codes, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
  } else {
    for (int i = 0; i < 2; ++i) {
      const __m128i q = _mm_loadu_si128((const __m128i*)(blk + 2 + 16 * i));
      w[i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
  }
}

#if defined(__AVX512BF16__)
#define RADIXRT_BF16_TILES 1
// Rows of blocks as bfloat16 (a tile of wide_linear for a bfloat16 x): the reference's float32
// weights rounded to nearest even in registers, as torch's cast rounds them, so the tile is
// written once at half the bytes instead of as float32 and then cast.
template <int64_t kind>
void dequantize_rows_bf16(const uint8_t* w, int64_t nb, int64_t rows, void* out) {
  auto* dst = static_cast<__m256i*>(out);
  for (int64_t i = 0; i < rows * nb; ++i) {
    __m512 wv[2];
    load_weights16<kind>(w + i * block_bytes(kind), wv);
    _mm256_storeu_si256(dst + 2 * i, (__m256i)_mm512_cvtneps_pbh(wv[0]));
    _mm256_storeu_si256(dst + 2 * i + 1, (__m256i)_mm512_cvtneps_pbh(wv[1]));
  }
}
#endif

// narrow_rows (below) with 16-float vectors: per block and input row, two FMAs. With 1-2 input
// rows, four accumulators per row (even and odd blocks, first and second half) keep enough
// FMA chains in flight; from 3 rows on, each row's two are chains enough.
template <int M, int64_t kind>
void narrow_rows(const float* x, const float*, const uint8_t* w, int64_t K, int64_t N,
                 int64_t n0, int64_t n1, float* y) {
  const int64_t nb = K / kBlock, bb = block_bytes(kind);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * nb * bb;
    __m512 even[2][M], odd[2][M];
    for (int r = 0; r < M; ++r)
      even[0][r] = even[1][r] = odd[0][r] = odd[1][r] = _mm512_setzero_ps();
    auto add_block = [&](int64_t b, __m512 (*into)[M]) {
      __m512 wv[2];
      _mm_prefetch(reinterpret_cast<const char*>(row + b * bb) + kPrefetchBytes, _MM_HINT_T0);
      load_weights16<kind>(row + b * bb, wv);
      for (int r = 0; r < M; ++r) {
        const float* xb = x + r * K + b * kBlock;
        into[0][r] = _mm512_fmadd_ps(wv[0], _mm512_loadu_ps(xb), into[0][r]);
        into[1][r] = _mm512_fmadd_ps(wv[1], _mm512_loadu_ps(xb + 16), into[1][r]);
      }
    };
    int64_t b = 0;
    if constexpr (M <= 2) {
      for (; b + 2 <= nb; b += 2) {
        add_block(b, even);
        add_block(b + 1, odd);
      }
    }
    for (; b < nb; ++b) add_block(b, even);
    for (int r = 0; r < M; ++r) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(even[0][r], even[1][r]),
                                       _mm512_add_ps(odd[0][r], odd[1][r]));
      y[r * N + n] = _mm512_reduce_add_ps(sum);
    }
  }
}
#else
// ---- Narrow inputs -------------------------------------------------------------------------
// Rows [n0, n1) of y for the M (few) rows of x; xsum[r * nb + b]: sum of x's block b in row r.
// Even and odd blocks go to separate accumulators: with one input row the adds into a single
// accumulator would be one chain of latencies through the whole weight row.
template <int M, int64_t kind>
void narrow_rows(const float* x, const float* xsum, const uint8_t* w, int64_t K, int64_t N,
                 int64_t n0, int64_t n1, float* y) {
  const int64_t nb = K / kBlock, bb = block_bytes(kind);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * nb * bb;
#ifdef RADIXRT_AVX2
    __m256 acc[2][M];
    __m128 mins[M];
    for (int r = 0; r < M; ++r) {
      acc[0][r] = acc[1][r] = _mm256_setzero_ps();
      mins[r] = _mm_setzero_ps();
    }
    auto add_block = [&](int64_t b, __m256* into) {
      const uint8_t* blk = row + b * bb;
      _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
      __m256 q[4];
      load_q(blk, kind, q);
      const __m128 dm = load_dm(blk);
      const __m256 d = _mm256_broadcastss_ps(dm);
      const __m128 m = _mm_movehdup_ps(dm);  // lane 0: m
      for (int r = 0; r < M; ++r) {
        into[r] = _mm256_fmadd_ps(d, block_dot(q, x + r * K + b * kBlock), into[r]);
        if (kind == kQ4_1) mins[r] = _mm_fmadd_ss(m, _mm_set_ss(xsum[r * nb + b]), mins[r]);
      }
    };
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      add_block(b, acc[0]);
      add_block(b + 1, acc[1]);
    }
    if (b < nb) add_block(b, acc[0]);
    for (int r = 0; r < M; ++r)
      y[r * N + n] = hsum(_mm256_add_ps(acc[0][r], acc[1][r])) + _mm_cvtss_f32(mins[r]);
#else
    float acc[M] = {};  // the block's m is in its dequantized weights here
    float wb[kBlock];
    for (int64_t b = 0; b < nb; ++b) {
      dequantize_block(row + b * bb, kind, wb);
      for (int r = 0; r < M; ++r)
        for (int j = 0; j < kBlock; ++j) acc[r] += wb[j] * x[r * K + b * kBlock + j];
    }
    for (int r = 0; r < M; ++r) y[r * N + n] = acc[r];
#endif
  }
}
#endif  // RADIXRT_AVX512

using RowsFn = void (*)(const float*, const float*, const uint8_t*, int64_t, int64_t, int64_t,
                        int64_t, float*);

template <int64_t kind>
RowsFn rows_fn_of(int64_t m) {
  switch (m) {
    case 1: return narrow_rows<1, kind>;
    case 2: return narrow_rows<2, kind>;
    case 3: return narrow_rows<3, kind>;
#ifdef RADIXRT_AVX512
    case 4: return narrow_rows<4, kind>;
    case 5: return narrow_rows<5, kind>;
    case 6: return narrow_rows<6, kind>;
    case 7: return narrow_rows<7, kind>;
    default: return narrow_rows<8, kind>;
#else
    default: return narrow_rows<4, kind>;
#endif
  }
}

RowsFn rows_fn(int64_t m, int64_t kind) {
  return kind == kQ4_1 ? rows_fn_of<kQ4_1>(m) : rows_fn_of<kQ8_0>(m);
}

// Few input rows (decode steps): four input rows at a time share each block's unpacked codes,
// and the threads split the output columns.
at::Tensor narrow_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t kind) {
  const int64_t M = x.size(0), K = x.size(1), N = blocks.size(0), nb = K / kBlock;
  at::Tensor y = at::empty({M, N}, x.options());
  // Block sums of x, for Q4_1's m * sum(x) terms (a plain loop: an aten sum per call would
  // cost as much as a small layer's matmul).
  std::vector<float> xsum(M * nb, 0.0f);
  const float* xp = x.data_ptr<float>();
  const bool needs_xsum = kind == kQ4_1 && !kAvx512;  // the AVX-512 path folds m into w
  for (int64_t i = 0; needs_xsum && i < M * nb; ++i)
    for (int64_t j = 0; j < kBlock; ++j) xsum[i] += xp[i * kBlock + j];
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  for (int64_t r0 = 0; r0 < M; r0 += kRowsPerPass) {
    const RowsFn fn = rows_fn(std::min<int64_t>(kRowsPerPass, M - r0), kind);
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
      fn(xp + r0 * K, xsum.data() + r0 * nb, w, K, N, n0, n1, y.data_ptr<float>() + r0 * N);
    });
  }
  return y;
}

// ---- Wide inputs ---------------------------------------------------------------------------
void check_args(const at::Tensor& blocks, int64_t kind, int64_t K) {
  TORCH_CHECK(kind == kQ4_1 || kind == kQ8_0, "gguf_linear: kind must be 0 (Q4_1) or 1 (Q8_0)");
  TORCH_CHECK(K % kBlock == 0, "gguf_linear: in_features must be a multiple of 32, got ", K);
  TORCH_CHECK(blocks.dtype() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
              "gguf_linear: blocks must be a contiguous uint8 [N, K / 32 * block bytes]");
  TORCH_CHECK(blocks.size(1) == K / kBlock * block_bytes(kind), "gguf_linear: blocks have ",
              blocks.size(1), " bytes per row, expected ", K / kBlock * block_bytes(kind));
}

// Rows of blocks into wt, in its dtype; `widened` is a float32 buffer as big (or undefined),
// for a bfloat16 wt where the CPU cannot round in registers.
void expand_rows(const uint8_t* w, int64_t kind, int64_t nb, int64_t rows,
                 const at::Tensor& wt, const at::Tensor& widened) {
  if (wt.scalar_type() == at::kFloat)
    return dequantize_rows(w, kind, nb, rows, wt.data_ptr<float>());
#ifdef RADIXRT_BF16_TILES
  if (kind == kQ4_1) return dequantize_rows_bf16<kQ4_1>(w, nb, rows, wt.data_ptr());
  return dequantize_rows_bf16<kQ8_0>(w, nb, rows, wt.data_ptr());
#else
  at::Tensor wide = widened.narrow(0, 0, rows);
  dequantize_rows(w, kind, nb, rows, wide.data_ptr<float>());
  wt.copy_(wide);
#endif
}

// Each thread takes whole tiles of weight rows: it expands a tile into its own buffer and
// multiplies it (a one-thread oneDNN call, dense_linear.cpp) into those columns of y while it is
// still in its core's cache; the threads' expansions and matmuls overlap instead of taking
// turns. A tile is 1 MiB of floats for few rows, growing with M up to 2 MiB: each call repacks x
// and has its set-up cost (at 32-64 rows, 192 KiB tiles were 1.5x slower than 1 MiB ones on an
// EPYC with 1 MiB of L2 a core). The tile count is a multiple of the thread count, so the
// threads get equal work. A bfloat16 x gets its tile rounded to bfloat16 too (the weights
// `--quantization none` would hold in that dtype), for bf16 matmul units' ~2x of float32.
at::Tensor wide_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t kind) {
  const int64_t M = x.size(0), K = x.size(1), N = blocks.size(0), nb = K / kBlock;
  const int64_t threads = at::get_num_threads();
  const int64_t tile_bytes = std::clamp<int64_t>(M * 2048, 1 << 20, 2 << 20);
  const int64_t target = std::max<int64_t>(8, tile_bytes / (K * 4));
  const int64_t tiles = ((N + target - 1) / target + threads - 1) / threads * threads;
  const int64_t tile = ((N + tiles - 1) / tiles + 7) / 8 * 8;
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, (N + tile - 1) / tile, 1, [&](int64_t t0, int64_t t1) {
    // The worker threads do not inherit the caller's inference mode, without which writing into
    // y (an inference tensor when the engine made it) is refused.
    c10::InferenceMode mode(inference);
    at::Tensor scratch = at::empty({tile, K}, x.options());
    at::Tensor widened;
#ifndef RADIXRT_BF16_TILES
    if (x.dtype() != at::kFloat) widened = at::empty({tile, K}, x.options().dtype(at::kFloat));
#endif
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * tile, rows = std::min(tile, N - n0);
      at::Tensor wt = scratch.narrow(0, 0, rows);
      expand_rows(w + n0 * nb * block_bytes(kind), kind, nb, rows, wt, widened);
      y.narrow(1, n0, rows).copy_(radixrt::dense_linear(x, wt));
    }
  });
  return y;
}

}  // namespace

namespace radixrt {

at::Tensor gguf_dequantize(const at::Tensor& blocks, int64_t kind, int64_t K) {
  check_args(blocks, kind, K);
  const int64_t N = blocks.size(0), nb = K / kBlock;
  at::Tensor out = at::empty({N, K}, blocks.options().dtype(at::kFloat));
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    dequantize_rows(w + n0 * nb * block_bytes(kind), kind, nb, n1 - n0,
                    out.data_ptr<float>() + n0 * K);
  });
  return out;
}

// x [M, K] float32 or bfloat16 -> [M, N] in x's dtype. Few rows run the block kernel in
// float32 (a bfloat16 x is widened, the result rounded); many rows, wide_linear in x's dtype.
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t kind,
                       int64_t dense_from_rows) {
  TORCH_CHECK((x.dtype() == at::kFloat || x.dtype() == at::kBFloat16) && x.dim() == 2,
              "gguf_linear: x must be float32 or bfloat16 [M, K], got ", x.dtype(), " of ",
              x.dim(), " dims");
  check_args(blocks, kind, x.size(1));
  if (x.size(0) >= dense_from_rows) return wide_linear(x.contiguous(), blocks, kind);
  if (x.dtype() == at::kFloat) return narrow_linear(x.contiguous(), blocks, kind);
  return narrow_linear(x.to(at::kFloat).contiguous(), blocks, kind).to(at::kBFloat16);
}

}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def("gguf_linear(Tensor x, Tensor blocks, int kind, int dense_from_rows) -> Tensor");
  m.def("gguf_dequantize(Tensor blocks, int kind, int in_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) {
  m.impl("gguf_linear", radixrt::gguf_linear);
  m.impl("gguf_dequantize", radixrt::gguf_dequantize);
}
