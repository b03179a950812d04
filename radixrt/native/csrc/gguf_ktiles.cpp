// Tiles for the K-quants (Q4_K, Q5_K, Q6_K: the types of the Q4_K_M / Q5_K_M files people
// download), the int8 kernel's copy for steps of a few rows, as gguf_tiles.cpp lays out the
// 32-weight types: 16 output columns interleaved, 4 codes of a column per 32-bit lane, so
// one dpbusd adds 4 products into every column's sum against 4 codes of x broadcast.
//
// Per super-block of 256 inputs a tile holds, for its 16 columns c:
//   d[c], dmin[c] (fp16; Q6_K's dmin is its d)      32 + 32 bytes
//   scales: sc[16 s + c], int8, per 32 inputs (Q4_K, Q5_K: 8) or per 16 (Q6_K: 16)
//   minimums: per 16 inputs g, m[32 (g / 2) + 2c + g % 2] (int8): Q4_K's and Q5_K's 6-bit
//             minimum of g's sub-block; Q6_K's scale of g, times 32 in the kernel (its raw
//             codes are q + 32)                        256 bytes
//   codes, per sub-block of 32 (8): 4 vectors of nibbles as Q4_0's tiles (byte 4c + i of
//             vector u: the low 4 bits of code 4u + i, and of code 16 + 4u + i above them),
//             then H vectors of the codes' high bits (Q5_K: 1, Q6_K: 2; Q4_K: none): byte
//             4c + i of high vector w holds, at bits H k, those of code 4 v + i, v = per w + k
//             (per = 8 / H), so a code is 4 + H bits, as stored: 4.5-6.6 bits a weight.
// The arithmetic is the block kernel's (gguf_dot8.cpp's add_super_block), per column: exact
// integer sums of sc u x8 over the super-block, then d dx times that minus dmin dx sum(m x8)
// in float; a row's result does not depend on how many rows the step has.
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#include "gguf_layout.h"
#include "gguf_types.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "tile_vectors.h"
#define RADIXRT_KTILES 1
#endif

namespace radixrt::gguf {

namespace {

constexpr int64_t high_vectors(int64_t type) { return type == Q6_K ? 2 : type == Q5_K ? 1 : 0; }
constexpr int64_t scale_count(int64_t type) { return type == Q6_K ? 16 : 8; }
constexpr int64_t kMins = 64;  // after d and dmin
constexpr int64_t codes_at(int64_t type) { return kMins + 256 + 16 * scale_count(type); }
constexpr int64_t scales_at() { return kMins + 256; }
constexpr int64_t sub_block_bytes(int64_t type) { return 256 + 64 * high_vectors(type); }

// Raw code e (0..255) of a super-block: unsigned, w = d sc u - dmin m (Q6_K: m = 32 sc).
int raw_code(int64_t type, const uint8_t* blk, int e) {
  const int s = e / 32, i = e % 32;
  if (type == Q4_K) return (blk[16 + 32 * (s / 2) + i] >> 4 * (s % 2)) & 0xF;
  if (type == Q5_K)
    return ((blk[48 + 32 * (s / 2) + i] >> 4 * (s % 2)) & 0xF) | ((blk[16 + i] >> s) & 1) << 4;
  const int half = s / 4, r = s % 4;  // Q6_K
  const int low = (blk[64 * half + 32 * (r % 2) + i] >> 4 * (r / 2)) & 0xF;
  return low | ((blk[128 + 32 * half + i] >> 2 * r) & 3) << 4;
}

// Column c's scales, minimums and codes of one super-block into a tile block `out`.
void tile_column(int64_t type, const uint8_t* blk, int c, uint8_t* out) {
  const bool q6 = type == Q6_K;
  std::memcpy(out + 2 * c, q6 ? blk + 208 : blk, 2);
  std::memcpy(out + 32 + 2 * c, q6 ? blk + 208 : blk + 2, 2);
  for (int g = 0; g < 16; ++g) {  // per 16 inputs
    int sc = 0, m = 0;
    if (q6) sc = m = static_cast<int8_t>(blk[192 + g]);
    else scale_min_k4(blk + 4, g / 2, sc, m);
    out[kMins + 32 * (g / 2) + 2 * c + g % 2] = static_cast<uint8_t>(m);
    if (q6 || g % 2 == 0) out[scales_at() + 16 * (q6 ? g : g / 2) + c] = static_cast<uint8_t>(sc);
  }
  const int64_t hv = high_vectors(type), per = hv ? 8 / hv : 8;
  for (int s = 0; s < 8; ++s) {
    uint8_t* codes = out + codes_at(type) + s * sub_block_bytes(type);
    for (int v = 0; v < 8; ++v)
      for (int i = 0; i < 4; ++i) {
        const int u = raw_code(type, blk, 32 * s + 4 * v + i);
        codes[64 * (v % 4) + 4 * c + i] |= static_cast<uint8_t>((u & 0xF) << 4 * (v / 4));
        if (hv) codes[256 + 64 * (v / per) + 4 * c + i] |= static_cast<uint8_t>((u >> 4) << hv * (v % per));
      }
  }
}

}  // namespace

bool is_ktile_type(int64_t type) { return type == Q4_K || type == Q5_K || type == Q6_K; }

int64_t ktile_block_bytes(int64_t type) { return codes_at(type) + 8 * sub_block_bytes(type); }

void build_ktiles(const Part& p, int64_t K, uint8_t* out) {
  const int64_t nb = K / 256, step = ktile_block_bytes(p.type), bytes = block_bytes(p.type);
  const int64_t tiles = (p.rows + kTileColumns - 1) / kTileColumns;
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* tb = out + (t * nb + b) * step;
        std::memset(tb, 0, step);  // codes are or-ed in; columns past the part stay zero
        for (int64_t c = 0; c < kTileColumns && t * kTileColumns + c < p.rows; ++c)
          tile_column(p.type, p.data + (t * kTileColumns + c) * p.row_bytes + b * bytes,
                      static_cast<int>(c), tb);
      }
  });
}

#ifdef RADIXRT_KTILES
namespace {

// Code vector v (codes 4v .. 4v + 3 of each column) of sub-block s of slice h.
template <int64_t T>
inline void load_codes8(const uint8_t* tb, int s, int h, VecI codes[8]) {
  load_nibble_codes<high_vectors(T)>(tb + codes_at(T) + s * sub_block_bytes(T) + 4 * kVectorColumns * h, codes);
}

// Sums of 4 code vectors (16 codes of each column) against one row's 16 codes of x at xq.
inline VecI sums16(const VecI* codes, const int8_t* xq) {
  VecI sum = zero_i();
  for (int v = 0; v < 4; ++v) {
    int32_t word;
    std::memcpy(&word, xq + 4 * v, 4);
    sum = dot4(sum, codes[v], splat_word(word));
  }
  return sum;
}

#ifdef RADIXRT_INT16_RUNS
// A lane's int32 scale as the same int16 twice, for madd against that lane's pair sums.
inline VecI scale_pairs(VecI scales) {
  return _mm256_or_si256(_mm256_and_si256(scales, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(scales, 16));
}

// total + sc (codes . x) over a sub-block's 8 code vectors without VNNI: the int16 pair sums of
// kRun vectors added as int16 (a pair is at most 2 * 127 * 15, 31 or 63: 8 vectors of Q4_K,
// 4 of Q5_K, 2 of Q6_K fit), then one madd by the scale pairs: the same integers as sums16
// times the scale, in fewer instructions.
template <int64_t T>
inline VecI scaled_runs(const VecI* codes, const int8_t* xq, VecI sc0, VecI sc1, VecI total) {
  constexpr int kRun = T == Q4_K ? 8 : T == Q5_K ? 4 : 2;
  for (int v0 = 0; v0 < 8; v0 += kRun) {
    VecI pairs = zero_i();
    for (int v = v0; v < v0 + kRun; ++v) {
      int32_t word;
      std::memcpy(&word, xq + 4 * v, 4);
      pairs = add16(pairs, pair_sums(codes[v], splat_word(word)));
    }
    total = add_i(total, _mm256_madd_epi16(pairs, v0 < 4 ? sc0 : sc1));
  }
  return total;
}
#endif

// Super-block b's integer sums of sc u x8 for rows r0 .. r0 + R against slice h: total[r].
template <int R, int64_t T>
inline void scaled_sums(const Q8Rows& a, int64_t r0, const uint8_t* tb, int64_t b, int h, VecI* total) {
  for (int r = 0; r < R; ++r) total[r] = zero_i();
  const uint8_t* sc = tb + scales_at() + kVectorColumns * h;
  for (int s = 0; s < 8; ++s) {
    VecI codes[8];
    load_codes8<T>(tb, s, h, codes);
    // Q6_K: a scale per 16 inputs; the others one per 32.
    const VecI sc0 = widen_i8(sc + 16 * (T == Q6_K ? 2 * s : s));
    const VecI sc1 = T == Q6_K ? widen_i8(sc + 16 * (2 * s + 1)) : sc0;
#ifdef RADIXRT_INT16_RUNS
    const VecI pairs0 = scale_pairs(sc0), pairs1 = T == Q6_K ? scale_pairs(sc1) : pairs0;
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = a.q.data() + ((r0 + r) * a.row_blocks + b) * 256 + 32 * s;
      total[r] = scaled_runs<T>(codes, xq, pairs0, pairs1, total[r]);
    }
#else
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = a.q.data() + ((r0 + r) * a.row_blocks + b) * 256 + 32 * s;
      if constexpr (T == Q6_K) {
        total[r] = add_i(total[r], mul_i(sums16(codes, xq), sc0));
        total[r] = add_i(total[r], mul_i(sums16(codes + 4, xq + 16), sc1));
      } else {
        total[r] = add_i(total[r], mul_i(add_i(sums16(codes, xq), sums16(codes + 4, xq + 16)), sc0));
      }
    }
#endif
  }
}

// Super-block b's sums of m x8 (the minimums, or Q6_K's 32 sc) for the same rows: mins[r].
template <int R, int64_t T>
inline void min_sums(const Q8Rows& a, int64_t r0, const uint8_t* tb, int64_t b, int h, VecI* mins) {
  for (int r = 0; r < R; ++r) mins[r] = zero_i();
  for (int s = 0; s < 8; ++s) {
    VecI m = widen_i8_pairs(tb + kMins + 32 * s + 2 * kVectorColumns * h);
    if constexpr (T == Q6_K) m = shift16<5>(m);
    for (int r = 0; r < R; ++r) {
      int32_t pair;  // x's code sums of the sub-block's two 16s, as int16 pairs
      std::memcpy(&pair, a.sums.data() + ((r0 + r) * a.row_blocks + b) * 16 + 2 * s, 4);
      mins[r] = dot2(mins[r], m, splat_word(pair));
    }
  }
}

// Rows r0 .. r0 + R of x against slice h of one tile, all its super-blocks: acc[r].
template <int R, int64_t T>
void kslice_rows(const Q8Rows& a, int64_t r0, const uint8_t* tile, int64_t nb, int h, VecF* acc) {
  constexpr int64_t kStep = codes_at(T) + 8 * sub_block_bytes(T);
  constexpr int64_t kScaleBytes = 2 * kVectorColumns;
  for (int r = 0; r < R; ++r) acc[r] = zero_f();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* tb = tile + b * kStep;
    if (h == 0) prefetch_ahead(tb, kStep);
    VecI sums[R];
    scaled_sums<R, T>(a, r0, tb, b, h, sums);
    const VecF d = scales16(tb + kScaleBytes * h), dmin = scales16(tb + 32 + kScaleBytes * h);
    float dx[R];  // x's scale of this super-block, per row
    for (int r = 0; r < R; ++r) dx[r] = a.d[(r0 + r) * a.row_blocks + b];
    for (int r = 0; r < R; ++r) acc[r] = fma(to_float(sums[r]), mul(d, splat(dx[r])), acc[r]);
    min_sums<R, T>(a, r0, tb, b, h, sums);
    for (int r = 0; r < R; ++r) acc[r] = fnma(to_float(sums[r]), mul(dmin, splat(dx[r])), acc[r]);
  }
}

}  // namespace

void ktiled_columns(const Q8Rows& a, const Part& p, int64_t lo, int64_t hi, int64_t M, float* y,
                    int64_t ldy) {
  const int64_t nb = a.K / 256;
  with_type<Q4_K, Q5_K, Q6_K>(p.type, [&]<int64_t T>() {
    tile_columns(p, lo, hi, M, y, ldy, nb * ktile_block_bytes(T), [&]<int R>(int64_t r0, const uint8_t* t, int h, VecF* acc) {
      kslice_rows<R, T>(a, r0, t, nb, h, acc);
    });
  });
}
#endif

}  // namespace radixrt::gguf
