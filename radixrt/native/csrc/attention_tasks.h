// How paged_attention.cpp shares a step's work among threads: its tiles (rows of one sequence
// and kv head) and, when they are too few to share evenly, each chunk of a tile as a task of
// its own whose partials are folded once all are done, in the order attention_chunks.h fixes.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention_chunks.h"
#include "paged_decode.h"

namespace radixrt_paged {

// Tiles of at most max_rows rows, each with all its chunks and its cost (rows x visible keys).
inline std::vector<Tile> plan_tiles(const Args& a, int64_t batch, int64_t max_rows) {
  const int64_t heads = std::min<int64_t>(a.group, max_rows);
  const int64_t tokens_per_tile = std::max<int64_t>(1, max_rows / heads);
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = a.qo_indptr[b + 1] - a.qo_indptr[b];
    for (int64_t kv = 0; kv < a.hkv; ++kv)
      for (int64_t h0 = 0; h0 < a.group; h0 += heads)
        for (int64_t t0 = 0; t0 < n; t0 += tokens_per_tile) {
          Tile t{b, kv, h0, std::min(heads, a.group - h0), t0, std::min(tokens_per_tile, n - t0),
                 0.0};
          const Span span = span_of(a, t);
          t.c1 = chunk_count(a, span);
          const double keys = static_cast<double>(span.key_end - span.key_begin);
          t.cost = keys * static_cast<double>(t.rows() + 8);
          tiles.push_back(t);
        }
  }
  return tiles;
}

// Too few tiles to share evenly among the threads (a batch-1 decode has one per kv head):
// each chunk of a tile becomes a task of its own, its partials kept for fold_buffered.
inline std::vector<Tile> split_chunks(std::vector<Tile> tiles, int64_t threads,
                                      PartBuffer& parts) {
  const int64_t count = static_cast<int64_t>(tiles.size());
  if (threads <= 1 || count % threads == 0 || count >= 4 * threads) return tiles;
  std::vector<Tile> tasks;
  for (const Tile& t : tiles) {
    if (t.c1 - t.c0 == 1) {
      tasks.push_back(t);
      continue;
    }
    for (int64_t c = t.c0; c < t.c1; ++c) {
      Tile part = t;
      part.c0 = c;
      part.c1 = c + 1;
      part.slot = parts.add(t.rows());
      part.cost = t.cost / static_cast<double>(t.c1 - t.c0);
      tasks.push_back(part);
    }
  }
  return tasks;
}

// The rows of tiles whose chunks ran as separate tasks: their partials folded in chunk order.
template <typename T>
void fold_buffered(const Args& a, const std::vector<Tile>& tasks) {
  std::vector<const Tile*> firsts;  // each split tile's chunk-0 task: its slots come first
  for (const Tile& t : tasks)
    if (t.slot >= 0 && t.c0 == 0) firsts.push_back(&t);
  at::parallel_for(0, static_cast<int64_t>(firsts.size()), 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> acc(a.head_dim);
    for (int64_t i = i0; i < i1; ++i) {
      const Tile& t = *firsts[i];
      const int64_t chunks = chunk_count(a, span_of(a, t));
      for (int64_t r = 0; r < t.rows(); ++r) {
        RowFold f{acc.data(), -INFINITY};
        f.start(a.init_o, a.init_lse, row_index(a, t, r), a.head_dim);
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t at = t.slot + c * t.rows() + r;  // a tile's slots are consecutive
          fold_part(f.o, f.lse, a.parts->o.data() + at * a.head_dim, a.parts->lse[at],
                    a.head_dim);
        }
        write_row<T>(a.sink, row_index(a, t, r), f, a.head_dim);
      }
    }
  });
}

}  // namespace radixrt_paged
