// Splitting a step's attention along the keys when it has too few tiles to keep every thread
// busy (paged_attention.cpp): a batch-1 decode or verification has one tile per kv head, so
// SmolLM2's 3 tiles on 2 threads ran in two rounds with a thread idle in the second, and a
// model with one kv head (Gemma 3 270M) left a thread idle throughout. Each tile's keys are cut
// into chunks that the threads share; a chunk's result is its rows' attention over its keys
// with their log-sum-exp, and the chunks' results are merged (flash-decoding's two passes).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "paged_decode.h"

namespace radixrt_paged {

// The fewest keys a chunk gets: shorter ones cost more in merging and set-up than they save
// (SmolLM2's shapes, 2 threads, 30 layers: at 500 keys halves were 0.69 -> 0.77 ms for a
// decode; at 800 keys 2.47 -> 2.15 ms for a verification of 2 tokens; at 2,000 keys 2.36 ->
// 2.12 ms for a decode and 10.8 -> 8.8 ms for 8 tokens).
constexpr int64_t kMinChunkKeys = 320;

// Chunks per tile: enough for the tiles' count to divide among the threads (1 where it
// does, or where there are so many tiles that an uneven last round costs little).
inline int64_t key_chunks(int64_t tiles, int64_t threads) {
  if (threads <= 1 || tiles % threads == 0 || tiles >= 4 * threads) return 1;
  return threads / std::gcd(tiles, threads);
}

// Each tile as up to `chunks` tiles over consecutive ranges of the keys that all its rows see
// (so no row of a chunk is without keys); the last takes the rest, its diagonal included.
// Chunk c > 0 writes to partial result c - 1.
inline std::vector<Tile> split_keys(const Args& a, const std::vector<Tile>& tiles, int64_t chunks) {
  std::vector<Tile> out;
  for (const Tile& t : tiles) {
    const int64_t n_new = a.qo_indptr[t.seq + 1] - a.qo_indptr[t.seq];
    const int64_t kv_len = a.kv_indptr[t.seq + 1] - a.kv_indptr[t.seq];
    const int64_t common = a.causal ? kv_len - n_new + t.t0 + 1 : kv_len;
    const int64_t c = a.window > 0 ? 1 : std::clamp<int64_t>(common / kMinChunkKeys, 1, chunks);
    for (int64_t i = 0; i < c; ++i) {
      Tile part = t;
      part.k0 = common * i / c / kKeyBlock * kKeyBlock;  // whole key blocks
      part.k1 = i + 1 < c ? common * (i + 1) / c / kKeyBlock * kKeyBlock : kAllKeys;
      part.chunk = static_cast<int>(i);
      part.cost = t.cost / static_cast<double>(c);
      out.push_back(part);
    }
  }
  std::sort(out.begin(), out.end(), [](const Tile& x, const Tile& y) { return x.cost > y.cost; });
  return out;
}

// Row i of (out, lse) becomes the attention over the union of its keys and the other part's:
// out = out * exp(lse - lse') + o_pre * exp(lse_pre - lse'), lse' = logaddexp(lse, lse_pre).
// rows[i / Hq] is the token of out that row i of the other part belongs to. A row the other
// part left at lse -inf (and out 0) keeps its values exactly.
template <typename T>
void merge_rows(at::Tensor& out, at::Tensor& lse, const at::Tensor& rows, const at::Tensor& o_pre,
                const at::Tensor& lse_pre) {
  const int64_t n = rows.numel(), hq = out.size(1), d_len = out.size(2);
  const int64_t* row = rows.data_ptr<int64_t>();
  T* o = out.data_ptr<T>();
  float* l = lse.data_ptr<float>();
  const T* p = o_pre.data_ptr<T>();
  const float* lp = lse_pre.data_ptr<float>();
  at::parallel_for(0, n * hq, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t own = row[i / hq] * hq + i % hq;  // (token, head) in out and lse
      const float a = l[own], b = lp[i];
      const float hi = std::max(a, b);
      const float merged = hi + std::log1p(std::exp(-std::abs(a - b)));
      const float wa = std::exp(a - merged), wb = std::exp(b - merged);
      T* dst = o + own * d_len;
      const T* src = p + i * d_len;
      for (int64_t d = 0; d < d_len; ++d)
        dst[d] = static_cast<T>(static_cast<float>(dst[d]) * wa + static_cast<float>(src[d]) * wb);
      l[own] = merged;
    }
  });
}

inline void merge_any(at::Tensor& out, at::Tensor& lse, const at::Tensor& rows,
                      const at::Tensor& o_pre, const at::Tensor& lse_pre) {
  switch (out.scalar_type()) {
    case at::kFloat: merge_rows<float>(out, lse, rows, o_pre, lse_pre); break;
    case at::kBFloat16: merge_rows<c10::BFloat16>(out, lse, rows, o_pre, lse_pre); break;
    default: merge_rows<c10::Half>(out, lse, rows, o_pre, lse_pre); break;
  }
}

}  // namespace radixrt_paged
