// The prefill tile's two products for a bfloat16 pool on CPUs with AVX-512 BF16 (included by
// paged_attention.cpp, which owns the tile, the online softmax and the layout).
//
// `vdpbf16ps` multiplies pairs of bfloat16 and adds both products to a float32 lane: with the
// rows in the lanes as in the float32 tile, one instruction does two head dims of a score (a
// pair of q elements per lane against one broadcast pair of k elements, read from the pool as
// is) or two keys of P @ V (a pair of probabilities per lane against one broadcast pair of v
// elements), half the instructions of the float32 FMAs. The sums stay float32. The scores are
// the float32 tile's exactly up to summation order (bf16 x bf16 is exact in float32); the
// probabilities are rounded to bfloat16 for P @ V (2^-9 relative, as GPU flash attention does
// for bf16 models), while the softmax sums and the log-sum-exp keep float32.
#pragma once

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define RADIXRT_BF16_DOT 1
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace radixrt_bf16 {

typedef float v16f __attribute__((vector_size(64)));

inline __m512 dot(__m512 acc, __m512i pairs, uint32_t broadcast_pair) {
  return _mm512_dpbf16_ps(acc, (__m512bh)pairs, (__m512bh)_mm512_set1_epi32(broadcast_pair));
}

inline uint32_t pair_at(const void* p) {  // two consecutive bfloat16
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

// Scores of keys j0..j0+kb-1 (kp[j]: key j's D bfloat16): St[j][rv] = scale * sum_d K[j][d] *
// Q[d][rv], from Q2[d / 2][rv], the rows' q elements (d, d + 1) paired in each lane.
template <int NR, int KJ, typename B>
void score_pairs(const B* const* kp, int kb, int64_t pairs, const __m512i* q2, float scale,
                 v16f* st) {
  for (int j = 0; j < kb; j += KJ) {
    const B* kj[KJ];
    __m512 acc[KJ][NR];
    for (int u = 0; u < KJ; ++u) {
      kj[u] = kp[j + u < kb ? j + u : kb - 1];  // past the block: its last key again, not stored
      for (int r = 0; r < NR; ++r) acc[u][r] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < pairs; ++p)
      for (int u = 0; u < KJ; ++u) {
        const uint32_t b = pair_at(kj[u] + 2 * p);
        for (int r = 0; r < NR; ++r) acc[u][r] = dot(acc[u][r], q2[p * NR + r], b);
      }
    for (int u = 0; u < KJ && j + u < kb; ++u)
      for (int r = 0; r < NR; ++r)
        st[(j + u) * NR + r] = (v16f)_mm512_mul_ps(acc[u][r], _mm512_set1_ps(scale));
  }
}

// P2[j / 2][rv]: the probabilities of keys (j, j + 1) paired per lane, bfloat16; an odd block's
// last pair gets 0 for its missing key.
template <int NR>
void pair_probabilities(int kb, const v16f* st, __m512i* p2) {
  // cvtne2ps gives [16 of lo | 16 of hi]; this permutation interleaves them per lane.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10,
                                              25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3,
                                              18, 2, 17, 1, 16, 0);
  for (int j = 0; j < kb; j += 2)
    for (int r = 0; r < NR; ++r) {
      const __m512 lo = (__m512)st[j * NR + r];
      const __m512 hi = j + 1 < kb ? (__m512)st[(j + 1) * NR + r] : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      p2[j / 2 * NR + r] = _mm512_permutexvar_epi16(interleave, both);
    }
}

// V2[j / 2][d]: the values of keys (j, j + 1) at dim d paired, from vp[j] (D bfloat16 each); an
// odd block's missing key is 0 (its probability is 0 too, and 0 * 0 stays 0).
template <typename B>
void pair_values(const B* const* vp, int kb, int64_t d_len, uint32_t* v2) {
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33,
                                          1, 32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  for (int j = 0; j < kb; j += 2) {
    const auto* v0 = reinterpret_cast<const uint16_t*>(vp[j]);
    const auto* v1 = j + 1 < kb ? reinterpret_cast<const uint16_t*>(vp[j + 1]) : nullptr;
    uint32_t* out = v2 + j / 2 * d_len;
    int64_t d = 0;
    for (; d + 32 <= d_len; d += 32) {
      const __m512i a = _mm512_loadu_si512(v0 + d);
      const __m512i b = v1 ? _mm512_loadu_si512(v1 + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + d, _mm512_permutex2var_epi16(a, lo_idx, b));
      _mm512_storeu_si512(out + d + 16, _mm512_permutex2var_epi16(a, hi_idx, b));
    }
    for (; d < d_len; ++d) out[d] = v0[d] | (v1 ? static_cast<uint32_t>(v1[d]) << 16 : 0u);
  }
}

// Ot[d][rv] = Ot[d][rv] * alpha[rv] + sum_j V[j][d] * P[j][rv] for dims d0..d0+DD-1.
template <int NR, int DD>
void accumulate_pairs(int kb, int64_t d_len, int64_t d0, const __m512i* p2, const uint32_t* v2,
                      const v16f* alpha, v16f* ot) {
  __m512 acc[DD][NR];
  for (int u = 0; u < DD; ++u)
    for (int r = 0; r < NR; ++r) acc[u][r] = (__m512)(ot[(d0 + u) * NR + r] * alpha[r]);
  for (int p = 0; p < (kb + 1) / 2; ++p)
    for (int u = 0; u < DD; ++u) {
      const uint32_t b = v2[p * d_len + d0 + u];
      for (int r = 0; r < NR; ++r) acc[u][r] = dot(acc[u][r], p2[p * NR + r], b);
    }
  for (int u = 0; u < DD; ++u)
    for (int r = 0; r < NR; ++r) ot[(d0 + u) * NR + r] = (v16f)acc[u][r];
}

template <int NR, int DD>
void accumulate_all_pairs(int kb, int64_t d_len, const __m512i* p2, const uint32_t* v2,
                          const v16f* alpha, v16f* ot) {
  int64_t d = 0;
  for (; d + DD <= d_len; d += DD) accumulate_pairs<NR, DD>(kb, d_len, d, p2, v2, alpha, ot);
  for (; d < d_len; d += 2) accumulate_pairs<NR, 2>(kb, d_len, d, p2, v2, alpha, ot);  // D even
}

}  // namespace radixrt_bf16

#endif
