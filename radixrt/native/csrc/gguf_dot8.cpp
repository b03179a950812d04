// The integer kernel (gguf_dot8.h): y = x W.T with x rounded to int8 per block.
// gguf_linear.cpp calls int8_linear for steps of up to `int8_rows` rows. The threads split a
// projection's output columns (all its parts at once); each takes them a tile at a time
// through every pass of up to 8 input rows, the 32-weight types' codes decoded once per tile.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gguf_layout.h"
#include "gguf_types.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "gguf_dot8.h"
#define RADIXRT_DOT8 1
#endif

namespace radixrt::gguf {

bool int8_supported() {
#ifdef RADIXRT_DOT8
  return true;
#else
  return false;
#endif
}

#ifdef RADIXRT_DOT8
namespace {

// Input rows sharing each sub-block's codes: AVX-512's 32 registers hold 8 rows' sums.
#ifdef __AVX512F__
constexpr int64_t kRowsPerPass = 8;
#else
constexpr int64_t kRowsPerPass = 4;
#endif
// Output columns a thread takes through all row passes before the next: their weight rows
// stay in its L1/L2 cache while every input row meets them (wide steps).
constexpr int64_t kColumnsPerTile = 16;
template <int64_t T>
constexpr bool kHasOffset = T == Q4_0 || T == Q4_1 || T == Q5_0 || T == Q5_1;  // b != 0

float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// sum += codes times x8, 4 bytes into each int32 lane: maddubs then madd, or one VNNI dpbusd
// where the CPU has it. The integers are exact either way (no pair of products reaches
// int16's limit), so both give the same sums, and so the same results.
template <int64_t T>
inline __m256i add_products(__m256i sum, __m256i codes, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (kSigned<T>)
    return _mm256_dpbusd_epi32(sum, _mm256_abs_epi8(codes), _mm256_sign_epi8(x, codes));
  return _mm256_dpbusd_epi32(sum, codes, x);
#else
  return _mm256_add_epi32(sum, _mm256_madd_epi16(pair_products<T>(codes, x), _mm256_set1_epi16(1)));
#endif
}

// An 8 x 8 transpose of 32-bit words: word k of vector i becomes word i of vector k.
inline void transpose8(__m256i v[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
    v[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
  }
}

// Eight consecutive 32-weight blocks of a weight row, decoded once for every input row they
// meet: their codes transposed (vector k holds word k, 4 codes, of each block, to match x's
// layout in quantize_rows) and each block's scale d and offset b (zero past the row's end).
struct alignas(32) Group32 {
  __m256i codes[8];
  __m256 d, off;
};

// Blocks [0, count) of 8 as they are stored: codes in block order, not yet transposed.
template <int64_t T, int count>
__attribute__((always_inline)) inline void load_group(const uint8_t* blocks, Group32& g) {
  prefetch_ahead(blocks, 8 * Traits<T>::bytes);
  for (int i = 0; i < 8; ++i)
    g.codes[i] = i < count ? raw32<T>(blocks + i * Traits<T>::bytes, 0) : _mm256_setzero_si256();
  block_scales<T>(blocks, count, g.d, g.off);
}

template <int64_t T, int count>
__attribute__((always_inline)) inline void decode_group(const uint8_t* blocks, Group32& g) {
  load_group<T, count>(blocks, g);
  transpose8(g.codes);
}

// Blocks [0, count) of 8 (fewer at a row's end), decoded into g.
template <int64_t T>
void decode_group(const uint8_t* blocks, int64_t count, Group32& g) {
  up_to<8>(count, [&]<int kCount>() { decode_group<T, kCount>(blocks, g); });
}

// One group into each row's 8 float lanes, one lane a block: 8 multiply-adds leave each
// block's integer total in its own lane (no reduction), then its total times d dx, plus its
// offset b times dx sum(x8): one conversion and two fmas per 8 blocks.
template <int M, int64_t T>
inline void add_group(const Group32& g, const Q8Rows& a, int64_t r0, int64_t b0, __m256* acc) {
  for (int r = 0; r < M; ++r) {
    const int64_t ab = (r0 + r) * a.row_blocks + b0;  // this row's first block of x
    const uint8_t* xq = reinterpret_cast<const uint8_t*>(a.q.data() + ab * 32);
    __m256i sums = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) sums = add_products<T>(sums, g.codes[k], load32(xq + 32 * k));
    const __m256 dx = _mm256_loadu_ps(a.d.data() + ab);  // zero past the row's end (padding)
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(g.d, dx), acc[r]);
    if constexpr (kHasOffset<T>) acc[r] = _mm256_fmadd_ps(g.off, _mm256_loadu_ps(a.dsum.data() + ab), acc[r]);
  }
}

// Four blocks' 8-lane sums as their four totals: [A, B, C, D].
inline __m128i totals4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// add_group for one pass of rows, whose x keeps its blocks in order (quantize_rows without
// `transposed`): the codes are not transposed, each block's sums are reduced to its total
// by a tree of adds instead. Those totals are the same integers, and the float steps after
// them the same, so a row's result is the same as add_group's; at 1-8 rows this is faster
// than transposing every group of codes for so few rows.
template <int M, int64_t T, int count>
inline void add_blocks_in_order(const uint8_t* blocks, const Q8Rows& a, int64_t r0, int64_t b0,
                                __m256* acc) {
  Group32 g;
  load_group<T, count>(blocks, g);
  for (int r = 0; r < M; ++r) {
    const int64_t ab = (r0 + r) * a.row_blocks + b0;
    const uint8_t* xq = reinterpret_cast<const uint8_t*>(a.q.data() + ab * 32);
    __m256i s[8];
    for (int i = 0; i < 8; ++i)
      s[i] = i < count ? add_products<T>(_mm256_setzero_si256(), g.codes[i], load32(xq + 32 * i))
                       : _mm256_setzero_si256();
    const __m256i totals = _mm256_set_m128i(totals4(s[4], s[5], s[6], s[7]),
                                            totals4(s[0], s[1], s[2], s[3]));
    const __m256 dx = _mm256_loadu_ps(a.d.data() + ab);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals), _mm256_mul_ps(g.d, dx), acc[r]);
    if constexpr (kHasOffset<T>) acc[r] = _mm256_fmadd_ps(g.off, _mm256_loadu_ps(a.dsum.data() + ab), acc[r]);
  }
}

// One 256-weight super-block: sums of sc u x8 in int32 over its 8 sub-blocks, then
// d dx that - dmin dx sum(mn x8) in float.
template <int M, int64_t T>
inline void add_super_block(const uint8_t* blk, const Q8Rows& a, int64_t r0, int64_t b,
                            __m256* acc) {
  KScales k;
  kscales<T>(blk, k);
  // Two sums a row, even and odd sub-blocks: one chain of 8 dependent dpwssd would wait on
  // its latency at one row.
  __m256i isum[2][M];
  for (auto& half : isum)
    for (auto& v : half) v = _mm256_setzero_si256();
  const int8_t* xq = a.q.data() + b * 256;
#pragma GCC unroll 8
  for (int s = 0; s < 8; ++s) {
    const __m256i codes = raw32<T>(blk, s);
    const __m256i scale = scale_of<T>(k, s);
    for (int r = 0; r < M; ++r) {
      const __m256i x = load32(reinterpret_cast<const uint8_t*>(xq + (r0 + r) * a.K + 32 * s));
      isum[s % 2][r] = add_scaled(isum[s % 2][r], pair_products<T>(codes, x), scale);
    }
  }
  for (int r = 0; r < M; ++r) isum[0][r] = _mm256_add_epi32(isum[0][r], isum[1][r]);
  for (int r = 0; r < M; ++r) {
    const int64_t ab = (r0 + r) * (a.K / 256) + b;
    const float dx = a.d[ab];
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[0][r]), _mm256_set1_ps(k.d * dx), acc[r]);
    if constexpr (T != IQ4_XS) {
      const __m256i x_sums = _mm256_loadu_si256((const __m256i*)(a.sums.data() + ab * 16));
      const __m256 m = _mm256_cvtepi32_ps(_mm256_madd_epi16(k.mn, x_sums));
      acc[r] = _mm256_fnmadd_ps(m, _mm256_set1_ps(k.dmin * dx), acc[r]);
    }
  }
}

// Output columns [n0, n1) of one part for rows r0 .. r0 + M of the quantized x; the
// 32-weight types read their columns' groups from `groups` (decode_groups, a column's
// row_blocks / 8 groups after another's).
template <int M, int64_t T>
void dot8_rows(const Q8Rows& a, int64_t r0, const Part& p, int64_t n0, int64_t n1,
               const Group32* groups, float* y, int64_t ldy) {
  constexpr int64_t kW = Traits<T>::weights, kB = Traits<T>::bytes;
  const int64_t nb = a.K / kW;
  for (int64_t n = n0; n < n1; ++n) {
    __m256 acc[M];
    for (auto& v : acc) v = _mm256_setzero_ps();
    if constexpr (kW == 32) {
      if (groups != nullptr) {
        const Group32* column = groups + (n - n0) * (a.row_blocks / 8);
        for (int64_t b = 0; b < nb; b += 8) add_group<M, T>(column[b / 8], a, r0, b, acc);
      } else {  // one pass over the rows: decode each group as it is used
        const uint8_t* row = p.data + n * p.row_bytes;
        for (int64_t b = 0; b < nb; b += 8) {
          const uint8_t* blocks = row + b * kB;
          up_to<8>(nb - b, [&]<int kCount>() { add_blocks_in_order<M, T, kCount>(blocks, a, r0, b, acc); });
        }
      }
    } else {
      const uint8_t* row = p.data + n * p.row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * kB;
        prefetch_ahead(blk, kB);
        add_super_block<M, T>(blk, a, r0, b, acc);
      }
    }
    for (int r = 0; r < M; ++r) y[(r0 + r) * ldy + p.row0 + n] = hsum(acc[r]);
  }
}

using Dot8Fn = void (*)(const Q8Rows&, int64_t, const Part&, int64_t, int64_t, const Group32*,
                        float*, int64_t);

template <int64_t T>
Dot8Fn dot8_fn(int64_t m) {
  return up_to<kRowsPerPass>(m, []<int M>() { return &dot8_rows<M, T>; });
}

}  // namespace

// One block of `group` inputs: d = max|x| / 127, q = round(x / d) (ties to even: the CPU's
// rounding mode), as llama.cpp's Q8_0 / Q8_K do (they round ties away from zero: a tie is rare
// in float inputs); the codes' sums per 16 beside them.
void quantize_block(const float* xb, int64_t group, int8_t* q, float* d, int16_t* sums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (int64_t j = 0; j < group; j += 8)
    vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
  *d = hmax(vmax) / 127.0f;
  const __m256 id = _mm256_set1_ps(*d > 0.0f ? 1.0f / *d : 0.0f);
  for (int64_t j = 0; j < group; j += 16) {
    const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), id));
    const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8), id));
    // packs works within 128-bit lanes: 16-bit [lo0-3 hi0-3 | lo4-7 hi4-7], fixed by permute.
    const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
    const __m128i w8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), w8);
    sums[j / 16] = static_cast<int16_t>(hsum_i32(_mm256_madd_epi16(w16, _mm256_set1_epi16(1))));
  }
}

const float* block_as_floats(const float* x, int64_t, float*) { return x; }
const float* block_as_floats(const c10::BFloat16* x, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(x[j]);
  return out;
}

// x's rows (float32, or bfloat16 widened a block at a time: exact, so both give the same codes).
template <typename In>
Q8Rows quantize_rows(const In* x, int64_t M, int64_t K, int64_t group, bool transposed) {
  Q8Rows a;
  const int64_t nb = K / group;
  a.K = K, a.group = group, a.transposed = transposed;
  a.row_blocks = group == 32 ? (nb + 7) / 8 * 8 : nb;
  a.q.resize(M * a.row_blocks * group);  // zeros: the padding blocks stay zero
  a.d.resize(M * a.row_blocks);
  a.sums.resize(M * a.row_blocks * group / 16);
  if (group == 32) a.dsum.resize(M * a.row_blocks);
  // Blocks are independent: wide inputs (prefill chunks) split them over the threads.
  at::parallel_for(0, M * nb, std::max<int64_t>(1, 16384 / group), [&](int64_t i0, int64_t i1) {
    alignas(32) int8_t q[256];
    alignas(32) float widened[256];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / nb, b = i % nb, ab = r * a.row_blocks + b;
      const float* xb = block_as_floats(x + r * K + b * group, group, widened);
      quantize_block(xb, group, q, a.d.data() + ab, a.sums.data() + ab * group / 16);
      if (group == 32) a.dsum[ab] = a.d[ab] * (a.sums[2 * ab] + a.sums[2 * ab + 1]);
      if (!transposed) {
        std::memcpy(a.q.data() + ab * group, q, group);
        continue;
      }
      // Word k of block b of a group of 8 goes to word b % 8 of the group's vector k.
      int8_t* group_q = a.q.data() + (ab - b % 8) * 32;
      for (int k = 0; k < 8; ++k) std::memcpy(group_q + 32 * k + 4 * (b % 8), q + 4 * k, 4);
    }
  });
  return a;
}

template Q8Rows quantize_rows(const float*, int64_t, int64_t, int64_t, bool);
template Q8Rows quantize_rows(const c10::BFloat16*, int64_t, int64_t, int64_t, bool);

// Columns [n0, n1) of the whole layout (across its parts) for every row of x, a tile of
// columns at a time. Each row's sums are the same whatever M is (rows never mix), so a
// request's result does not depend on its batch.
void int8_columns(const Q8Rows& by32, const Q8Rows& by256, const Layout& l, int64_t M,
                  int64_t n0, int64_t n1, float* y) {
  for (const Part& p : l.parts) {
    const int64_t lo = std::max(n0, p.row0) - p.row0, hi = std::min(n1, p.row0 + p.rows) - p.row0;
    if (lo >= hi) continue;
    if (p.tiles != nullptr) {
      if (is_ktile_type(p.type)) ktiled_columns(by256, p, lo, hi, M, y, l.N);
      else tiled_columns(by32, p, lo, hi, M, y, l.N);
      continue;
    }
    dispatch(p.type, [&]<int64_t T>() {
      constexpr bool kGroups = Traits<T>::weights == 32;
      const Q8Rows& a = kGroups ? by32 : by256;
      // Several row passes: each column's codes decoded once for all of them.
      const bool keep = kGroups && a.transposed;
      std::vector<Group32> groups(keep ? kColumnsPerTile * a.row_blocks / 8 : 0);
      for (int64_t c0 = lo; c0 < hi; c0 += kColumnsPerTile) {
        const int64_t c1 = std::min(hi, c0 + kColumnsPerTile);
        for (int64_t c = c0; keep && c < c1; ++c)
          for (int64_t b = 0; b < a.K / 32; b += 8)
            decode_group<T>(p.data + c * p.row_bytes + b * Traits<T>::bytes,
                            std::min<int64_t>(8, a.K / 32 - b),
                            groups[(c - c0) * (a.row_blocks / 8) + b / 8]);
        for (int64_t r0 = 0; r0 < M; r0 += kRowsPerPass)
          dot8_fn<T>(std::min(kRowsPerPass, M - r0))(a, r0, p, c0, c1,
                                                     keep ? groups.data() : nullptr, y, l.N);
      }
    });
  }
}

// y in x's dtype. A bfloat16 y is rounded from the float sums by each thread for its own
// columns, as y.to(bfloat16) would round them (c10's round to nearest even): no whole-tensor
// conversions, which at batch 1 cost more than the small projections themselves.
at::Tensor int8_linear(const at::Tensor& x, const Layout& l) {
  const int64_t M = x.size(0);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  at::Tensor y = at::empty({M, l.N}, x.options());
  std::vector<float> sums(bf16 ? M * l.N : 0);
  bool small = false, large = false, tiled = false;
  for (const Part& p : l.parts) {
    dispatch(p.type, [&]<int64_t T>() { (Traits<T>::weights == 32 ? small : large) = true; });
    tiled = tiled || p.tiles != nullptr;
  }
  // Several row passes transpose the 32-weight types' codes, unless tiles read x as it is.
  const bool passes = M > kRowsPerPass && !tiled;
  auto quantize = [&](int64_t group, bool transposed) {
    return bf16 ? quantize_rows(x.data_ptr<c10::BFloat16>(), M, l.K, group, transposed)
                : quantize_rows(x.data_ptr<float>(), M, l.K, group, transposed);
  };
  const Q8Rows by32 = small ? quantize(32, passes) : Q8Rows{};
  const Q8Rows by256 = large ? quantize(256, false) : Q8Rows{};
  float* yp = bf16 ? sums.data() : y.data_ptr<float>();
  // One parallel region for the whole projection: its parts are split together.
  at::parallel_for(0, l.N, kColumnsPerTile, [&](int64_t n0, int64_t n1) {
    int8_columns(by32, by256, l, M, n0, n1, yp);
    if (!bf16) return;
    c10::BFloat16* out = y.data_ptr<c10::BFloat16>();
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = n0; n < n1; ++n) out[r * l.N + n] = c10::BFloat16(yp[r * l.N + n]);
  });
  return y;
}
#else
at::Tensor int8_linear(const at::Tensor&, const Layout&) {
  TORCH_CHECK(false, "gguf_linear: the int8 kernel needs AVX2, FMA and F16C");
}
#endif

}  // namespace radixrt::gguf
