// The decode tile for a bfloat16 pool on CPUs with AVX-512 BF16 (included by paged_attention.cpp,
// whose decode_tile does the same in float32 FMAs for every other case).
//
// One new token, up to GM query heads of one kv head, against all of its sequence's keys. K and
// V are used as they lie in the pool, 32 bfloat16 per register, through `vdpbf16ps` (pairs of
// bfloat16 products added to float32 lanes):
// - a score is H = head_dim / 32 pair dot products of q and k and one horizontal sum, no
//   widening of k to float32;
// - P @ V takes two keys per instruction: v_j and v_j+1 interleaved by unpacklo/hi_epi16, which
//   leaves the dims permuted within each 128-bit lane (lane 4L + i holds dim 8L + i of the low
//   unpack and 8L + 4 + i of the high one); the accumulators keep that order and the output is
//   written back through it.
// The probabilities are rounded to bfloat16 for P @ V, as in the prefill tile (attention_bf16.h);
// the softmax's max and sum and the log-sum-exp stay float32.
#pragma once

#include "attention_bf16.h"

#ifdef RADIXRT_BF16_DOT
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec8.h"

namespace radixrt_bf16 {

constexpr int kDecodeKeys = 64;  // keys per online-softmax block

// Dim of lane `lane` of accumulator `half` (0: unpacklo, 1: unpackhi) of register h.
inline int64_t unpacked_dim(int h, int half, int lane) {
  return 32 * h + 8 * (lane / 4) + 4 * half + lane % 4;
}

// q: the first head's D values, heads q_head_stride apart (out alike); k, v: the pool at the
// kv head (slot s at s * slot_stride); lse: the first head's entry.
template <int H, int GM, typename B>
void decode_pairs(const B* q, int64_t q_head_stride, int g_len, const B* k, const B* v,
                  const int64_t* slots, int64_t kv_len, int64_t slot_stride, float scale, B* out,
                  float* lse) {
  using radixrt_vec8::v8f;
  __m512i qz[GM][H];
  __m512 o[GM][H][2];
  float m[GM], l[GM];
  alignas(64) float p[GM][kDecodeKeys];
  alignas(64) uint16_t pb[GM][kDecodeKeys];  // p rounded to bfloat16, 0 past the block
  for (int g = 0; g < g_len; ++g) {
    for (int h = 0; h < H; ++h) {
      qz[g][h] = _mm512_loadu_si512(q + g * q_head_stride + 32 * h);
      o[g][h][0] = o[g][h][1] = _mm512_setzero_ps();
    }
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  for (int64_t j0 = 0; j0 < kv_len; j0 += kDecodeKeys) {
    const int kb = static_cast<int>(std::min<int64_t>(kDecodeKeys, kv_len - j0));
    for (int j = 0; j < kb; ++j) {  // scores
      const B* kj = k + slots[j0 + j] * slot_stride;
      __m512i kz[H];
      for (int h = 0; h < H; ++h) kz[h] = _mm512_loadu_si512(kj + 32 * h);
      for (int g = 0; g < g_len; ++g) {
        __m512 acc = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)qz[g][0], (__m512bh)kz[0]);
        for (int h = 1; h < H; ++h)
          acc = _mm512_dpbf16_ps(acc, (__m512bh)qz[g][h], (__m512bh)kz[h]);
        p[g][j] = _mm512_reduce_add_ps(acc) * scale;
      }
    }
    const int padded = (kb + 15) / 16 * 16;
    for (int g = 0; g < g_len; ++g) {  // online softmax; padding keys get probability 0
      for (int j = kb; j < padded; ++j) p[g][j] = -INFINITY;
      float block_max = -INFINITY;
      for (int j = 0; j < kb; ++j) block_max = std::max(block_max, p[g][j]);
      const float m_new = std::max(m[g], block_max);
      const __m512 alpha = _mm512_set1_ps(std::exp(m[g] - m_new));
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < padded; j += 16) {
        const v8f lo = radixrt_vec8::vexp(*reinterpret_cast<const v8f*>(&p[g][j]) - m_new);
        const v8f hi = radixrt_vec8::vexp(*reinterpret_cast<const v8f*>(&p[g][j + 8]) - m_new);
        const __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512((__m256)lo), (__m256)hi, 1);
        sum = _mm512_add_ps(sum, e);
        _mm256_store_si256(reinterpret_cast<__m256i*>(&pb[g][j]), (__m256i)_mm512_cvtneps_pbh(e));
      }
      l[g] = l[g] * std::exp(m[g] - m_new) + _mm512_reduce_add_ps(sum);
      m[g] = m_new;
      for (int h = 0; h < H; ++h) {
        o[g][h][0] = _mm512_mul_ps(o[g][h][0], alpha);
        o[g][h][1] = _mm512_mul_ps(o[g][h][1], alpha);
      }
    }
    for (int j = 0; j < kb; j += 2) {  // P @ V, two keys at a time
      const B* v0 = v + slots[j0 + j] * slot_stride;
      const B* v1 = j + 1 < kb ? v + slots[j0 + j + 1] * slot_stride : nullptr;
      __m512i lo[H], hi[H];
      for (int h = 0; h < H; ++h) {
        const __m512i a = _mm512_loadu_si512(v0 + 32 * h);
        const __m512i b = v1 ? _mm512_loadu_si512(v1 + 32 * h) : _mm512_setzero_si512();
        lo[h] = _mm512_unpacklo_epi16(a, b);
        hi[h] = _mm512_unpackhi_epi16(a, b);
      }
      for (int g = 0; g < g_len; ++g) {
        const __m512bh pair = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_at(&pb[g][j])));
        for (int h = 0; h < H; ++h) {
          o[g][h][0] = _mm512_dpbf16_ps(o[g][h][0], (__m512bh)lo[h], pair);
          o[g][h][1] = _mm512_dpbf16_ps(o[g][h][1], (__m512bh)hi[h], pair);
        }
      }
    }
  }
  for (int g = 0; g < g_len; ++g) {
    alignas(64) float lanes[16];
    const float inv = 1.0f / l[g];
    for (int h = 0; h < H; ++h)
      for (int half = 0; half < 2; ++half) {
        _mm512_store_ps(lanes, o[g][h][half]);
        for (int lane = 0; lane < 16; ++lane)
          out[g * q_head_stride + unpacked_dim(h, half, lane)] = static_cast<B>(lanes[lane] * inv);
      }
    lse[g] = m[g] + std::log(l[g]);
  }
}

}  // namespace radixrt_bf16

#endif
