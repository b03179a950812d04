// Tiles: the int8 kernel's copy of a Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 part, laid out for steps of
// a few rows (speculative verification, small batches). The K-quants' are in gguf_ktiles.cpp.
//
// The block kernel (gguf_dot8.cpp) multiplies one weight row's block by a row of x: 32 products
// in one vector, then a horizontal sum, which costs more than the products. A tile instead holds
// 16 output columns' codes interleaved, 4 codes of each column per 32-bit lane, so that one
// instruction adds 4 products into each of 8 columns' sums, against 4 codes of x broadcast; no
// horizontal sums, and the codes are loaded once for all the rows of a step. Per block of 32
// inputs a tile holds the columns' fp16 scales d (and Q4_1's and Q5_1's minimums m), then
// their codes:
//   Q4_0 / Q4_1: 4 x 64 bytes; byte 4c + i of vector u holds column c's code 4u + i in its
//                low nibble and code 16 + 4u + i in its high one (Q4's own nibble split);
//   Q5_0 / Q5_1: the same, then 64 bytes of fifth bits: bit v of byte 4c + i is code 4v + i's;
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
#include "tile_vectors.h"
#define RADIXRT_TILES 1
#endif

namespace radixrt::gguf {

namespace {

// Bytes of one block of one tile: its scales, then its codes.
constexpr bool has_min(int64_t type) { return type == Q4_1 || type == Q5_1; }
constexpr bool five_bit(int64_t type) { return type == Q5_0 || type == Q5_1; }
constexpr int64_t scale_bytes(int64_t type) { return has_min(type) ? 64 : 32; }
constexpr int64_t tile_block_bytes(int64_t type) {
  return scale_bytes(type) + (type == Q8_0 ? 512 : 256) + (five_bit(type) ? 64 : 0);
}

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
    if (has_min(p.type)) std::memcpy(out + 32 + 2 * c, blk + 2, 2);  // m
    // Q4_0 [d][qs], Q4_1 [d][m][qs], Q5_0 [d][qh][qs], Q5_1 [d][m][qh][qs]
    const uint8_t* qh = blk + scale_bytes(p.type) / 16;
    const uint8_t* qs = qh + (five_bit(p.type) ? 4 : 0);
    for (int u = 0; u < 4; ++u)
      for (int i = 0; i < 4; ++i)
        codes[64 * u + 4 * c + i] =
            static_cast<uint8_t>(nibble(qs, 4 * u + i) | nibble(qs, 16 + 4 * u + i) << 4);
    if (!five_bit(p.type)) continue;
    uint32_t fifth;
    std::memcpy(&fifth, qh, 4);
    for (int v = 0; v < 8; ++v)
      for (int i = 0; i < 4; ++i) codes[256 + 4 * c + i] |= static_cast<uint8_t>((fifth >> (4 * v + i) & 1) << v);
  }
}

// Code j (0..31) of column c in a tile's 4 vectors of nibbles (tile_block's inverse).
uint8_t tile_nibble(const uint8_t* codes, int64_t c, int j) {
  const int half = j / 16, k = j % 16;  // high nibbles hold codes 16..31
  return codes[64 * (k / 4) + 4 * c + k % 4] >> 4 * half & 0xF;
}

}  // namespace

bool untile_supported(int64_t type) {
  return type == Q4_0 || type == Q4_1 || five_bit(type) || type == Q8_0;
}

void untile_row(const Part& p, int64_t K, int64_t n, uint8_t* row) {
  const int64_t nb = K / 32, step = tile_block_bytes(p.type), bytes = block_bytes(p.type);
  const int64_t c = n % kTileColumns;
  const uint8_t* tile = p.tiles + n / kTileColumns * nb * step;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* tb = tile + b * step;
    const uint8_t* codes = tb + scale_bytes(p.type);
    uint8_t* blk = row + b * bytes;
    std::memcpy(blk, tb + 2 * c, 2);  // d
    if (p.type == Q8_0) {
      for (int v = 0; v < 8; ++v) std::memcpy(blk + 2 + 4 * v, codes + 64 * v + 4 * c, 4);
      continue;
    }
    if (has_min(p.type)) std::memcpy(blk + 2, tb + 32 + 2 * c, 2);  // m
    uint8_t* qh = blk + scale_bytes(p.type) / 16;
    uint8_t* qs = qh + (five_bit(p.type) ? 4 : 0);
    for (int j = 0; j < 16; ++j)
      qs[j] = static_cast<uint8_t>(tile_nibble(codes, c, j) | tile_nibble(codes, c, 16 + j) << 4);
    if (!five_bit(p.type)) continue;
    uint32_t fifth = 0;
    for (int v = 0; v < 8; ++v)
      for (int i = 0; i < 4; ++i) fifth |= static_cast<uint32_t>(codes[256 + 4 * c + i] >> v & 1) << (4 * v + i);
    std::memcpy(qh, &fifth, 4);
  }
}

bool tiles_supported(int64_t type) {
#if !(defined(__AVX512F__) && defined(__AVX512BW__))
  // AVX2 (a slice is half a tile): at one row Q4_K's tiles took 1.06-1.20x its block kernel's
  // time (Xeon with AVX-VNNI; EPYC without, int16 runs and all), and on the EPYC Q6_K's
  // 1.27x (docs/quantization.md, scripts/bench_gguf_types.py --tiles). Batch-1 decode comes
  // first, so those keep their blocks there.
  if (type == Q4_K) return false;
#ifdef RADIXRT_INT16_RUNS
  if (type == Q6_K) return false;
#endif
#endif
  return int8_supported() &&
         (type == Q4_0 || type == Q4_1 || five_bit(type) || type == Q8_0 || is_ktile_type(type));
}

int64_t tiles_bytes(int64_t type, int64_t rows, int64_t K) {
  const int64_t tiles = (rows + kTileColumns - 1) / kTileColumns;
  if (is_ktile_type(type)) return tiles * (K / 256) * ktile_block_bytes(type);
  return tiles * (K / 32) * tile_block_bytes(type);
}

void build_tiles(const Part& p, int64_t K, uint8_t* out) {
  if (is_ktile_type(p.type)) return build_ktiles(p, K, out);
  const int64_t nb = K / 32, step = tile_block_bytes(p.type);
  const int64_t tiles = (p.rows + kTileColumns - 1) / kTileColumns;
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t b = 0; b < nb; ++b) tile_block(p, t * kTileColumns, b, out + (t * nb + b) * step);
  });
}

#ifdef RADIXRT_TILES
namespace {

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
  if constexpr (has_min(T)) g.off = scales16(tb + 32 + kScaleBytes * h);
  else if constexpr (T == Q4_0) g.off = mul(g.d, splat(-8.0f));  // w = d (q - 8)
  else if constexpr (T == Q5_0) g.off = mul(g.d, splat(-16.0f));  // w = d (q - 16)
  const uint8_t* codes = tb + scale_bytes(T) + 4 * kVectorColumns * h;
  if constexpr (T == Q8_0) {
    for (int v = 0; v < 8; ++v) g.codes[v] = absolute(load_codes(codes + 64 * v), g.signs, v);
  } else {
    load_nibble_codes<five_bit(T) ? 1 : 0>(codes, g.codes);
  }
}

// Code vector v's 4 codes of x broadcast to every lane (signed by the weights' for Q8_0).
template <int64_t T>
inline VecI x_word(const SliceBlock& g, const int8_t* xq, int v) {
  int32_t word;
  std::memcpy(&word, xq + 4 * v, 4);
  VecI x = splat_word(word);
  if constexpr (T == Q8_0) x = signed_x(x, g.signs, v);
  return x;
}

// The block's integer sums of the slice's columns against one row's 32 codes of x.
template <int64_t T>
inline VecI block_sums(const SliceBlock& g, const int8_t* xq) {
  VecI sum = zero_i();
#ifdef RADIXRT_INT16_RUNS
  // Code vectors whose int16 pair sums add up without overflow: a pair is at most
  // 2 * 127 * (15, 31 or 128), so 8 vectors of Q4 (30,480), 4 of Q5 (31,496), 1 of Q8_0.
  constexpr int kRun = T == Q8_0 ? 1 : five_bit(T) ? 4 : 8;
  for (int v0 = 0; v0 < 8; v0 += kRun) {
    VecI pairs = pair_sums(g.codes[v0], x_word<T>(g, xq, v0));
    for (int v = v0 + 1; v < v0 + kRun; ++v) pairs = add16(pairs, pair_sums(g.codes[v], x_word<T>(g, xq, v)));
    sum = widen_pairs(sum, pairs);
  }
#else
  for (int v = 0; v < 8; ++v) sum = dot4(sum, g.codes[v], x_word<T>(g, xq, v));
#endif
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
  with_type<Q4_0, Q4_1, Q5_0, Q5_1, Q8_0>(p.type, [&]<int64_t T>() {
    tile_columns(p, lo, hi, M, y, ldy, nb * tile_block_bytes(T), [&]<int R>(int64_t r0, const uint8_t* t, int h, VecF* acc) {
      slice_rows<R, T>(a, r0, t, nb, h, acc);
    });
  });
}
#endif

}  // namespace radixrt::gguf
