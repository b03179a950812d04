// The paged attention kernel's arguments and tiles (paged_attention.cpp), and its decode
// tiles: one new token against its sequence's keys, vectorized over head_dim.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "attention_bf16.h"
#include "decode_bf16.h"
#include "vec8.h"

namespace radixrt_paged {

using namespace radixrt_vec8;

constexpr int kKeyBlock = 64;  // keys scored per online-softmax step

// Whether a tile of T runs its products on bfloat16 pairs (attention_bf16.h).
template <typename T>
constexpr bool kPairs =
#ifdef RADIXRT_BF16_DOT
    std::is_same_v<T, c10::BFloat16>;  // AVX-512 BF16 implies 16-float tiles
#else
    false;
#endif

struct Args {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int64_t* qo_indptr;
  const int64_t* kv_indptr;
  const int64_t* kv_indices;
  int64_t q_stride_t, q_stride_h;  // q and out share their layout: [T, Hq, D] contiguous
  int64_t kv_stride_slot, kv_stride_head;
  int64_t hq, hkv, group, head_dim;
  float scale;
  bool causal;  // false: every row sees all of its sequence's keys (a shared prefix)
  int64_t window;  // > 0: a row at position p sees keys p - window + 1 .. p only (causal only)
};

// Rows of one tile: tokens t0..t0+tokens-1 of sequence seq, query heads h0..h0+heads-1 of
// kv head kv_head's group; row r = (token t0 + r / heads, head h0 + r % heads).
// A tile may take only keys [k0, k1) (attention_split.h): chunk `chunk` of its keys.
constexpr int64_t kAllKeys = INT64_MAX;
struct Tile {
  int64_t seq, kv_head, h0, heads, t0, tokens;
  double cost;
  int64_t k0 = 0, k1 = kAllKeys;
  int chunk = 0;
};

// Decode tiles (one new token, the G <= 8 query heads of one kv head) go another way: scores
// and the output are vectorized over head_dim, so every lane works whatever G is (the rows-in-
// lanes layout above used 3 lanes of 8 for SmolLM2's G = 3), and each key's K and V vectors
// are loaded once for all G heads. A decode token sees all of its sequence's keys.
constexpr int kMaxDecodeHeads = 8;

// A decode token's keys: its sequence's slots and their count, the last `window` of them with
// a sliding window.
std::pair<const int64_t*, int64_t> decode_keys(const Args& a, const Tile& tile) {
  const int64_t len = std::min(a.kv_indptr[tile.seq + 1] - a.kv_indptr[tile.seq], tile.k1);
  const int64_t skip = a.window > 0 ? std::max<int64_t>(0, len - a.window) : tile.k0;
  return {a.kv_indices + a.kv_indptr[tile.seq] + skip, len - skip};
}

template <typename T, int DV>  // DV = head_dim / 8
void decode_tile(const Args& a, const Tile& tile) {
  const int g_len = static_cast<int>(tile.heads);
  const auto [slots, kv_len] = decode_keys(a, tile);
  const int64_t head0 = tile.kv_head * a.group + tile.h0;
  const int64_t q_row = a.qo_indptr[tile.seq] * a.q_stride_t;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  v8f qs[kMaxDecodeHeads][DV], o[kMaxDecodeHeads][DV];
  float m[kMaxDecodeHeads], l[kMaxDecodeHeads];
  alignas(32) float p[kMaxDecodeHeads][kKeyBlock];
  for (int g = 0; g < g_len; ++g) {
    for (int dv = 0; dv < DV; ++dv) {
      qs[g][dv] = load8(q + q_row + (head0 + g) * a.q_stride_h + dv * kLanes) * a.scale;
      o[g][dv] = splat(0.0f);
    }
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  for (int64_t j0 = 0; j0 < kv_len; j0 += kKeyBlock) {
    const int kb = static_cast<int>(std::min<int64_t>(kKeyBlock, kv_len - j0));
    for (int j = 0; j < kb; ++j) {  // scores
      const T* kj = k + slots[j0 + j] * a.kv_stride_slot + tile.kv_head * a.kv_stride_head;
      v8f kv[DV];
      for (int dv = 0; dv < DV; ++dv) kv[dv] = load8(kj + dv * kLanes);
      for (int g = 0; g < g_len; ++g) {
        v8f acc0 = qs[g][0] * kv[0], acc1 = qs[g][1] * kv[1];
        for (int dv = 2; dv < DV; dv += 2) {
          acc0 += qs[g][dv] * kv[dv];
          acc1 += qs[g][dv + 1] * kv[dv + 1];
        }
        p[g][j] = hsum(acc0 + acc1);
      }
    }
    const int padded = (kb + kLanes - 1) / kLanes * kLanes;
    for (int g = 0; g < g_len; ++g) {  // online softmax; padding keys get probability 0
      for (int j = kb; j < padded; ++j) p[g][j] = -INFINITY;
      float block_max = -INFINITY;
      for (int j = 0; j < kb; ++j) block_max = std::max(block_max, p[g][j]);
      const float m_new = std::max(m[g], block_max);
      const float alpha = vexp(splat(m[g] - m_new))[0];
      v8f sum = splat(0.0f);
      for (int j = 0; j < padded; j += kLanes) {
        v8f e = vexp(load8(&p[g][j]) - m_new);
        std::memcpy(&p[g][j], &e, sizeof(e));
        sum += e;
      }
      l[g] = l[g] * alpha + hsum(sum);
      m[g] = m_new;
      for (int dv = 0; dv < DV; ++dv) o[g][dv] *= alpha;
    }
    for (int j = 0; j < kb; ++j) {  // P @ V
      const T* vj = v + slots[j0 + j] * a.kv_stride_slot + tile.kv_head * a.kv_stride_head;
      v8f vv[DV];
      for (int dv = 0; dv < DV; ++dv) vv[dv] = load8(vj + dv * kLanes);
      for (int g = 0; g < g_len; ++g) {
        const v8f pj = splat(p[g][j]);
        for (int dv = 0; dv < DV; ++dv) o[g][dv] += pj * vv[dv];
      }
    }
  }
  T* out = static_cast<T*>(a.out);
  for (int g = 0; g < g_len; ++g) {
    const int64_t off = q_row + (head0 + g) * a.q_stride_h;
    const float inv = 1.0f / l[g];
    for (int dv = 0; dv < DV; ++dv)
      for (int i = 0; i < kLanes; ++i) out[off + dv * kLanes + i] = static_cast<T>(o[g][dv][i] * inv);
    a.lse[off / a.head_dim] = m[g] + std::log(l[g]);
  }
}

#ifdef RADIXRT_BF16_DOT
// The decode tile on bfloat16 pairs (decode_bf16.h), GM heads at a time (its registers).
template <typename T, int H, int GM>
void decode_tile_pairs(const Args& a, const Tile& tile) {
  const auto [slots, kv_len] = decode_keys(a, tile);
  const int64_t head0 = tile.kv_head * a.group + tile.h0;
  const int64_t q_row = a.qo_indptr[tile.seq] * a.q_stride_t;
  const int64_t kv_off = tile.kv_head * a.kv_stride_head;
  for (int64_t g0 = 0; g0 < tile.heads; g0 += GM) {
    const int64_t off = q_row + (head0 + g0) * a.q_stride_h;
    const int heads = static_cast<int>(std::min<int64_t>(GM, tile.heads - g0));
    radixrt_bf16::decode_pairs<H, GM>(
        static_cast<const T*>(a.q) + off, a.q_stride_h, heads,
        static_cast<const T*>(a.k) + kv_off, static_cast<const T*>(a.v) + kv_off, slots, kv_len,
        a.kv_stride_slot, a.scale, static_cast<T*>(a.out) + off, a.lse + off / a.head_dim);
  }
}
#endif

template <typename T>
bool try_decode_tile(const Args& a, const Tile& tile) {
  const bool decode = tile.tokens == 1 && tile.heads <= kMaxDecodeHeads &&
                      a.qo_indptr[tile.seq + 1] - a.qo_indptr[tile.seq] == 1;
  if (!decode) return false;
#ifdef RADIXRT_BF16_DOT
  if constexpr (kPairs<T>) {
    switch (a.head_dim) {
      case 64: decode_tile_pairs<T, 2, 4>(a, tile); return true;
      case 128: decode_tile_pairs<T, 4, 2>(a, tile); return true;
      default: break;
    }
  }
#endif
  switch (a.head_dim) {
    case 64: decode_tile<T, 8>(a, tile); return true;
    case 128: decode_tile<T, 16>(a, tile); return true;
    default: return false;
  }
}

}  // namespace radixrt_paged
