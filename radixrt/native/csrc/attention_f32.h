// The prefill tile's two products in float32 FMAs, for any pool dtype (included by
// paged_attention.cpp, which owns the tile, the online softmax and the layout; attention_bf16.h
// has the bfloat16 pairs' version): the rows of a tile sit in the lanes of `vtile`, and each
// K (or V) element is converted once and broadcast against every row vector.
#pragma once

#include <algorithm>
#include <cstdint>

#include "vec8.h"

namespace radixrt_tile {

using namespace radixrt_vec8;

// The general tile's vector, one lane per row: 16 floats where AVX-512 has them, else v8f.
#if defined(__AVX512F__)
typedef float vtile __attribute__((vector_size(64)));
#else
typedef v8f vtile;
#endif
constexpr int kTileLanes = sizeof(vtile) / sizeof(float);

// Keys (scores) or head dims (P @ V) handled together by the loops below, so that
// chains() * NR independent sums are in flight. With AVX2's 16 registers ~8 sums cover the FMA
// latency; AVX-512's 32 hold 3x as many, and reusing each broadcast key (or value) element for
// more rows (and each row vector for more keys) measured 1.5x faster on a 2,000-token prefill
// (scripts/bench_cpu_attention.py). Even, because D is only known to be even.
template <int NR>
constexpr int chains() {
  if constexpr (kTileLanes == 16) return NR >= 2 ? 6 : 12;
  return NR >= 3 ? 2 : (NR == 2 ? 4 : 8);
}

// Scores of keys j0..j0+kb-1 for the tile's rows: St[j][rv] = sum_d K[j][d] * Qt[d][rv].
template <typename T, int NR>
void score_block(const T* const* kp, int kb, int64_t d_len, const vtile* qt, vtile* st) {
  constexpr int KJ = chains<NR>();
  for (int j = 0; j < kb; j += KJ) {
    const T* kj[KJ];
    vtile acc[KJ][NR];
    for (int u = 0; u < KJ; ++u) {
      kj[u] = kp[std::min(j + u, kb - 1)];  // past the block: its last key again, not stored
      for (int r = 0; r < NR; ++r) acc[u][r] = splat<vtile>(0.0f);
    }
    for (int64_t d = 0; d < d_len; ++d)
      for (int u = 0; u < KJ; ++u) {
        const vtile b = splat<vtile>(to_float(kj[u][d]));
        for (int r = 0; r < NR; ++r) acc[u][r] += b * qt[d * NR + r];
      }
    for (int u = 0; u < KJ && j + u < kb; ++u)
      for (int r = 0; r < NR; ++r) st[(j + u) * NR + r] = acc[u][r];
  }
}

// Ot[d][rv] = Ot[d][rv] * alpha[rv] + sum_j V[j][d] * St[j][rv] for head dims d0..d0+DD-1.
template <typename T, int NR, int DD>
void accumulate_dims(const T* const* vp, int kb, int64_t d0, const vtile* st,
                     const vtile* alpha, vtile* ot) {
  vtile acc[DD][NR];
  for (int u = 0; u < DD; ++u)
    for (int r = 0; r < NR; ++r) acc[u][r] = ot[(d0 + u) * NR + r] * alpha[r];
  for (int j = 0; j < kb; ++j)
    for (int u = 0; u < DD; ++u) {
      const vtile b = splat<vtile>(to_float(vp[j][d0 + u]));
      for (int r = 0; r < NR; ++r) acc[u][r] += b * st[j * NR + r];
    }
  for (int u = 0; u < DD; ++u)
    for (int r = 0; r < NR; ++r) ot[(d0 + u) * NR + r] = acc[u][r];
}

template <typename T, int NR>
void accumulate_block(const T* const* vp, int kb, int64_t d_len, const vtile* st,
                      const vtile* alpha, vtile* ot) {
  constexpr int DD = chains<NR>();
  int64_t d = 0;
  for (; d + DD <= d_len; d += DD) accumulate_dims<T, NR, DD>(vp, kb, d, st, alpha, ot);
  for (; d < d_len; d += 2) accumulate_dims<T, NR, 2>(vp, kb, d, st, alpha, ot);  // D is even
}

}  // namespace radixrt_tile
