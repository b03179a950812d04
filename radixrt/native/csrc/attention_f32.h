// The general tile's two products in float32 (included by paged_attention.cpp, which owns the
// tile, the online softmax and the layout): the rows of a tile sit in the lanes of `vtile`,
// and each K (or V) element is converted once and broadcast against every row vector.
//
// Every lane adds up in the decode tile's order (paged_decode.h), so that a row's result does
// not depend on which of the two tiles ran it: a score is the decode tile's two 8-lane chains
// over head_dim and its tree of adds (hsum), written out per lane, and P @ V adds the keys in
// order onto the rescaled sum. Every fused multiply-add is named (fmadd): the file is compiled
// without contraction, so nothing else is fused behind the order's back.
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

// Head sizes whose scores the decode tile's order covers (two chains of 8-float vectors);
// other sizes add each row's products in one chain, in the general tile only.
inline bool decode_order(int64_t d_len) { return d_len % 16 == 0; }

// Keys whose scores are computed together, so that 2 x KJ x NR chains are in flight (one key
// of one row vector has only two: latency-bound, 4x slower at batch 1).
template <int NR>
constexpr int score_keys() {
  return NR >= 3 ? 1 : (NR == 2 ? 2 : 4);
}

// s[u * NR + r] = lane i of the decode tile's acc0 + acc1 for key u of k, row vector r: dims
// i, i + 16, ... in one chain and i + 8, i + 24, ... in the other.
template <typename T, int NR, int KJ>
inline void lane_pair(const T* const* k, int64_t d_len, const vtile* qt, int i, vtile* s) {
  vtile a0[KJ][NR], a1[KJ][NR];
  for (int u = 0; u < KJ; ++u) {
    const vtile k0 = splat<vtile>(to_float(k[u][i])), k1 = splat<vtile>(to_float(k[u][8 + i]));
    for (int r = 0; r < NR; ++r) {
      a0[u][r] = qt[i * NR + r] * k0;
      a1[u][r] = qt[(8 + i) * NR + r] * k1;
    }
  }
  for (int64_t d = 16 + i; d < d_len; d += 16)
    for (int u = 0; u < KJ; ++u) {
      const vtile b0 = splat<vtile>(to_float(k[u][d])), b1 = splat<vtile>(to_float(k[u][d + 8]));
      for (int r = 0; r < NR; ++r) {
        a0[u][r] = fmadd(qt[d * NR + r], b0, a0[u][r]);
        a1[u][r] = fmadd(qt[(d + 8) * NR + r], b1, a1[u][r]);
      }
    }
  for (int u = 0; u < KJ; ++u)
    for (int r = 0; r < NR; ++r) s[u * NR + r] = a0[u][r] + a1[u][r];
}

// (lane a + lane b) of hsum's first step, per key and row vector.
template <typename T, int NR, int KJ>
inline void lane_sum(const T* const* k, int64_t d_len, const vtile* qt, int a, int b,
                     vtile* out) {
  vtile x[KJ * NR], y[KJ * NR];
  lane_pair<T, NR, KJ>(k, d_len, qt, a, x);
  lane_pair<T, NR, KJ>(k, d_len, qt, b, y);
  for (int m = 0; m < KJ * NR; ++m) out[m] = x[m] + y[m];
}

// Scores of keys j0..j0+KJ-1 in the decode tile's order: hsum's tree,
// ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
template <typename T, int NR, int KJ>
inline void score_keys_in_order(const T* const* k, int64_t d_len, const vtile* qt, vtile* out) {
  vtile x[KJ * NR], y[KJ * NR], u0[KJ * NR];
  lane_sum<T, NR, KJ>(k, d_len, qt, 0, 4, x);
  lane_sum<T, NR, KJ>(k, d_len, qt, 2, 6, y);
  for (int m = 0; m < KJ * NR; ++m) u0[m] = x[m] + y[m];
  lane_sum<T, NR, KJ>(k, d_len, qt, 1, 5, x);
  lane_sum<T, NR, KJ>(k, d_len, qt, 3, 7, y);
  for (int m = 0; m < KJ * NR; ++m) out[m] = u0[m] + (x[m] + y[m]);
}

// Scores of keys j = 0..kb-1 (kp[j]: key j's D values) for the tile's rows, St[j][rv], from
// Qt[d][rv] (q transposed and scaled).
template <typename T, int NR>
void score_block(const T* const* kp, int kb, int64_t d_len, const vtile* qt, vtile* st) {
  if (!decode_order(d_len)) {
    for (int j = 0; j < kb; ++j) {
      const T* k = kp[j];
      vtile acc[NR];
      for (int r = 0; r < NR; ++r) acc[r] = qt[r] * splat<vtile>(to_float(k[0]));
      for (int64_t d = 1; d < d_len; ++d) {
        const vtile b = splat<vtile>(to_float(k[d]));
        for (int r = 0; r < NR; ++r) acc[r] = fmadd(qt[d * NR + r], b, acc[r]);
      }
      for (int r = 0; r < NR; ++r) st[j * NR + r] = acc[r];
    }
    return;
  }
  constexpr int KJ = score_keys<NR>();
  for (int j = 0; j < kb; j += KJ) {
    const T* k[KJ];
    for (int u = 0; u < KJ; ++u) k[u] = kp[std::min(j + u, kb - 1)];  // past kb: not stored
    vtile out[KJ * NR];
    score_keys_in_order<T, NR, KJ>(k, d_len, qt, out);
    for (int u = 0; u < KJ && j + u < kb; ++u)
      for (int r = 0; r < NR; ++r) st[(j + u) * NR + r] = out[u * NR + r];
  }
}

// The chains P @ V keeps in flight: with AVX2's 16 registers ~8 sums cover the FMA latency,
// AVX-512's 32 hold 3x as many. Even, because D is only known to be even.
template <int NR>
constexpr int chains() {
  if constexpr (kTileLanes == 16) return NR >= 2 ? 6 : 12;
  return NR >= 3 ? 2 : (NR == 2 ? 4 : 8);
}

// Ot[d][rv] = Ot[d][rv] * alpha[rv] + sum_j V[j][d] * St[j][rv] for head dims d0..d0+DD-1,
// the keys added in order.
template <typename T, int NR, int DD>
void accumulate_dims(const T* const* vp, int kb, int64_t d0, const vtile* st,
                     const vtile* alpha, vtile* ot) {
  vtile acc[DD][NR];
  for (int u = 0; u < DD; ++u)
    for (int r = 0; r < NR; ++r) acc[u][r] = ot[(d0 + u) * NR + r] * alpha[r];
  for (int j = 0; j < kb; ++j)
    for (int u = 0; u < DD; ++u) {
      const vtile b = splat<vtile>(to_float(vp[j][d0 + u]));
      for (int r = 0; r < NR; ++r) acc[u][r] = fmadd(st[j * NR + r], b, acc[u][r]);
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
