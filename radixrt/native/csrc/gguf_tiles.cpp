// Tiles: the int8 kernel's copy of a Q4_0, Q4_1 or Q8_0 part, laid out for steps of a few rows
// (speculative verification, small batches).
//
// The block kernel (gguf_dot8.cpp) multiplies one weight row's block by a row of x: 32 products
// in one vector, then a horizontal sum, which costs more than the products. A tile instead holds
// 16 output columns' codes interleaved, 4 codes of each column per 32-bit lane, so that one
// instruction adds 4 products into each of 8 columns' sums, against 4 codes of x broadcast; no
// horizontal sums, and the codes are loaded once for all the rows of a step. Per block of 32
// inputs a tile holds the columns' fp16 scales d (and Q4_1's minimums m), then their codes:
//   Q4_0 / Q4_1: 4 x 64 bytes; byte 4c + i of vector u holds column c's code 4u + i in its
//                low nibble and code 16 + 4u + i in its high one (Q4's own nibble split);
//   Q8_0:        8 x 64 bytes; byte 4c + i of vector v is column c's code 4v + i.
// Tiles go column tile by column tile, each tile's blocks in order (a thread streams them). A
// tile past the part's last column holds zeros. The arithmetic is the block kernel's, per
// column: exact integer sums per block, then acc += sum (d dx) + b (dx sum(x8)), in block
// order, so a row's result does not depend on how many rows the step has.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gguf_layout.h"
#include "gguf_types.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "gguf_dot8.h"
#define RADIXRT_TILES 1
#endif

namespace radixrt::gguf {

namespace {

constexpr int64_t kTileColumns = 16;

// Bytes of one block of one tile: its scales, then its codes.
constexpr int64_t scale_bytes(int64_t type) { return type == Q4_1 ? 64 : 32; }
constexpr int64_t tile_block_bytes(int64_t type) { return scale_bytes(type) + (type == Q8_0 ? 512 : 256); }

// Code j (0..31) of a Q4 block's 16 nibble bytes: low nibbles first, then high ones.
uint8_t nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4; }

void tile_block(const Part& p, int64_t n0, int64_t b, uint8_t* out) {
  const int64_t bytes = block_bytes(p.type);
  uint8_t* codes = out + scale_bytes(p.type);
  for (int64_t c = 0; c < kTileColumns && n0 + c < p.rows; ++c) {
    const uint8_t* blk = p.data + (n0 + c) * p.row_bytes + b * bytes;
    std::memcpy(out + 2 * c, blk, 2);  // d
    if (p.type == Q8_0) {
      for (int v = 0; v < 8; ++v) std::memcpy(codes + 64 * v + 4 * c, blk + 2 + 4 * v, 4);
      continue;
    }
    if (p.type == Q4_1) std::memcpy(out + 32 + 2 * c, blk + 2, 2);  // m
    const uint8_t* qs = blk + (p.type == Q4_1 ? 4 : 2);
    for (int u = 0; u < 4; ++u)
      for (int i = 0; i < 4; ++i)
        codes[64 * u + 4 * c + i] =
            static_cast<uint8_t>(nibble(qs, 4 * u + i) | nibble(qs, 16 + 4 * u + i) << 4);
  }
}

}  // namespace

bool tiles_supported(int64_t type) {
  return int8_supported() && (type == Q4_0 || type == Q4_1 || type == Q8_0);
}

int64_t tiles_bytes(int64_t type, int64_t rows, int64_t K) {
  return (rows + kTileColumns - 1) / kTileColumns * (K / 32) * tile_block_bytes(type);
}

void build_tiles(const Part& p, int64_t K, uint8_t* out) {
  const int64_t nb = K / 32, step = tile_block_bytes(p.type);
  const int64_t tiles = (p.rows + kTileColumns - 1) / kTileColumns;
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t b = 0; b < nb; ++b) tile_block(p, t * kTileColumns, b, out + (t * nb + b) * step);
  });
}

#ifdef RADIXRT_TILES
namespace {

// Input rows per pass over a tile's blocks: their sums stay in registers (32 of them with
// AVX-512's encoding, 16 without).
#ifdef __AVX512F__
constexpr int kTileRows = 8;
#else
constexpr int kTileRows = 4;
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
// AVX-512: a vector holds all 16 columns of a tile.
constexpr int kVectorColumns = 16;
using VecI = __m512i;
using VecF = __m512;
inline VecI load_codes(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline VecI splat_word(int32_t w) { return _mm512_set1_epi32(w); }
inline VecF splat(float f) { return _mm512_set1_ps(f); }
inline VecF scales16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VecI low_nibbles(VecI v) { return _mm512_and_si512(v, _mm512_set1_epi8(0xF)); }
inline VecI high_nibbles(VecI v) { return low_nibbles(_mm512_srli_epi16(v, 4)); }
inline VecI dot4(VecI sum, VecI codes, VecI x) {
#ifdef __AVX512VNNI__
  return _mm512_dpbusd_epi32(sum, codes, x);
#else
  return _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(codes, x), _mm512_set1_epi16(1)));
#endif
}
// Q8_0: |q| times x with q's sign (AVX-512 has no byte sign instruction: x negated by mask).
struct Signs {
  __mmask64 negative[8];
};
inline VecI absolute(VecI q, Signs& s, int v) {
  s.negative[v] = _mm512_movepi8_mask(q);
  return _mm512_abs_epi8(q);
}
inline VecI signed_x(VecI x, const Signs& s, int v) {
  return _mm512_mask_sub_epi8(x, s.negative[v], _mm512_setzero_si512(), x);
}
inline void store_columns(VecF acc, float* out) { _mm512_storeu_ps(out, acc); }
inline VecI zero_i() { return _mm512_setzero_si512(); }
inline VecF zero_f() { return _mm512_setzero_ps(); }
inline VecF to_float(VecI v) { return _mm512_cvtepi32_ps(v); }
inline VecF fma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
#else
// AVX2: a vector holds 8 columns, a tile's half.
constexpr int kVectorColumns = 8;
using VecI = __m256i;
using VecF = __m256;
inline VecI load_codes(const uint8_t* p) { return load32(p); }
inline VecI splat_word(int32_t w) { return _mm256_set1_epi32(w); }
inline VecF splat(float f) { return _mm256_set1_ps(f); }
inline VecF scales16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VecI low_nibbles(VecI v) { return _mm256_and_si256(v, _mm256_set1_epi8(0xF)); }
inline VecI high_nibbles(VecI v) { return low_nibbles(_mm256_srli_epi16(v, 4)); }
// Exact either way: no pair of products passes int16 (15 * 127 or 128 * 127, twice).
inline VecI dot4(VecI sum, VecI codes, VecI x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(sum, codes, x);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(sum, codes, x);
#else
  return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), _mm256_set1_epi16(1)));
#endif
}
struct Signs {
  __m256i q[8];
};
inline VecI absolute(VecI q, Signs& s, int v) {
  s.q[v] = q;
  return _mm256_abs_epi8(q);
}
inline VecI signed_x(VecI x, const Signs& s, int v) { return _mm256_sign_epi8(x, s.q[v]); }
inline void store_columns(VecF acc, float* out) { _mm256_storeu_ps(out, acc); }
inline VecI zero_i() { return _mm256_setzero_si256(); }
inline VecF zero_f() { return _mm256_setzero_ps(); }
inline VecF to_float(VecI v) { return _mm256_cvtepi32_ps(v); }
inline VecF fma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
#endif
constexpr int kSlices = kTileColumns / kVectorColumns;  // vectors across a tile

// One block of a slice of a tile's columns (slice h of kSlices), ready for the rows: codes
// (|q| for Q8_0, its signs apart), scales d and offsets b as floats.
struct SliceBlock {
  VecI codes[8];
  Signs signs;
  VecF d, off;
};

template <int64_t T>
inline void load_slice(const uint8_t* tb, int h, SliceBlock& g) {
  constexpr int64_t kScaleBytes = 2 * kVectorColumns;
  g.d = scales16(tb + kScaleBytes * h);
  if constexpr (T == Q4_1) g.off = scales16(tb + 32 + kScaleBytes * h);
  else if constexpr (T == Q4_0) g.off = mul(g.d, splat(-8.0f));  // w = d (q - 8)
  const uint8_t* codes = tb + scale_bytes(T) + 4 * kVectorColumns * h;
  if constexpr (T == Q8_0) {
    for (int v = 0; v < 8; ++v) g.codes[v] = absolute(load_codes(codes + 64 * v), g.signs, v);
  } else {
    for (int u = 0; u < 4; ++u) {
      const VecI both = load_codes(codes + 64 * u);
      g.codes[u] = low_nibbles(both);
      g.codes[u + 4] = high_nibbles(both);
    }
  }
}

// The block's integer sums of the slice's columns against one row's 32 codes of x.
template <int64_t T>
inline VecI block_sums(const SliceBlock& g, const int8_t* xq) {
  VecI sum = zero_i();
  for (int v = 0; v < 8; ++v) {
    int32_t word;
    std::memcpy(&word, xq + 4 * v, 4);
    VecI x = splat_word(word);
    if constexpr (T == Q8_0) x = signed_x(x, g.signs, v);
    sum = dot4(sum, g.codes[v], x);
  }
  return sum;
}

// Rows r0 .. r0 + R of x against slice h of one tile, all its blocks: acc[r].
template <int R, int64_t T>
void slice_rows(const Q8Rows& a, int64_t r0, const uint8_t* tile, int64_t nb, int h, VecF* acc) {
  constexpr int64_t kStep = tile_block_bytes(T);
  for (int r = 0; r < R; ++r) acc[r] = zero_f();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* tb = tile + b * kStep;
    if (h == 0) prefetch_ahead(tb, kStep);
    SliceBlock g;
    load_slice<T>(tb, h, g);
    for (int r = 0; r < R; ++r) {
      const int64_t ab = (r0 + r) * a.row_blocks + b;
      const VecF sums = to_float(block_sums<T>(g, a.q.data() + ab * 32));
      acc[r] = fma(sums, mul(g.d, splat(a.d[ab])), acc[r]);
      if constexpr (T != Q8_0) acc[r] = fma(g.off, splat(a.dsum[ab]), acc[r]);
    }
  }
}

}  // namespace

void tiled_columns(const Q8Rows& a, const Part& p, int64_t lo, int64_t hi, int64_t M, float* y,
                   int64_t ldy) {
  const int64_t nb = a.K / 32;
  auto run = [&]<int64_t T>() {
    for (int64_t t = lo / kTileColumns; t * kTileColumns < hi; ++t) {
      const uint8_t* tile = p.tiles + t * nb * tile_block_bytes(T);
      for (int h = 0; h < kSlices; ++h) {
        const int64_t c0 = t * kTileColumns + kVectorColumns * h;
        const int64_t from = std::max(lo, c0), to = std::min(hi, c0 + kVectorColumns);
        if (from >= to) continue;
        for (int64_t r0 = 0; r0 < M; r0 += kTileRows) {
          up_to<kTileRows>(M - r0, [&]<int kR>() {
            VecF acc[kR];
            slice_rows<kR, T>(a, r0, tile, nb, h, acc);
            for (int r = 0; r < kR; ++r) {
              float out[kVectorColumns];
              store_columns(acc[r], out);
              std::memcpy(y + (r0 + r) * ldy + p.row0 + from, out + (from - c0), (to - from) * 4);
            }
          });
        }
      }
    }
  };
  switch (p.type) {
    case Q4_0: run.template operator()<Q4_0>(); break;
    case Q4_1: run.template operator()<Q4_1>(); break;
    default: run.template operator()<Q8_0>(); break;
  }
}
#endif

}  // namespace radixrt::gguf
