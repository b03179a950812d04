// The order in which a row's attention adds up, whatever its batch (paged_attention.cpp).
//
// A row's keys are cut at fixed positions: chunk c holds keys [c kKeyChunk, (c + 1) kKeyChunk)
// of its sequence, and within a chunk the online softmax takes blocks of kKeyBlock keys from
// the chunk's start. Each chunk gives a normalized partial result and its log-sum-exp; the
// partials are folded left to right, chunk 0 first (fold_part). Where the cuts fall depends
// only on the row's own position, never on its batch, its tile or the thread count, so a
// token gets the same bits in a batch of 64 as alone, in a prefill chunk as in a decode step,
// and after a cache hit as in the first run. Threads may share one row's chunks (a batch-1
// decode has one tile per kv head): each writes its chunk's partial to a buffer, and the same
// fold runs once they are all done.
//
// A prefix that several sequences share is folded in as whole chunks (`init`): its partials
// are computed once for all their rows (a cascade), and each row's own chunks fold after them.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace radixrt_paged {

constexpr int64_t kKeyChunk = 256;  // keys per chunk: a multiple of kKeyBlock
constexpr int kKeyBlock = 64;       // keys per online-softmax step

// acc (its rows' running result, lse -inf when empty) folds in one chunk's partial: the
// attention over the union of their keys. A partial with lse -inf (a row that saw no key of
// that chunk) changes nothing; the first one is taken as it is.
inline void fold_part(float* acc, float& acc_lse, const float* part, float part_lse,
                      int64_t d_len) {
  if (part_lse == -INFINITY) return;
  if (acc_lse == -INFINITY) {
    std::memcpy(acc, part, d_len * sizeof(float));
    acc_lse = part_lse;
    return;
  }
  const float hi = std::max(acc_lse, part_lse);
  const float merged = hi + std::log1p(std::exp(-std::abs(acc_lse - part_lse)));
  const float wa = std::exp(acc_lse - merged), wb = std::exp(part_lse - merged);
  for (int64_t d = 0; d < d_len; ++d) acc[d] = acc[d] * wa + part[d] * wb;
  acc_lse = merged;
}

// A row's running fold, started from its shared prefix's partials where it has some.
struct RowFold {
  float* o;  // [D]
  float lse;

  void start(const float* init_o, const float* init_lse, int64_t row, int64_t d_len) {
    lse = init_lse != nullptr ? init_lse[row] : -INFINITY;
    if (lse != -INFINITY) std::memcpy(o, init_o + row * d_len, d_len * sizeof(float));
  }
};

// Where a step's rows end: out in q's dtype (or float32 for a cascade's partials) and lse.
struct Sink {
  void* out;
  float* lse;
  bool float_out;  // out is float32 (a shared prefix's fold, read back as `init`)
};

template <typename T>
inline void write_row(const Sink& sink, int64_t row, const RowFold& f, int64_t d_len) {
  if (sink.float_out) {
    std::memcpy(static_cast<float*>(sink.out) + row * d_len, f.o, d_len * sizeof(float));
  } else {
    T* dst = static_cast<T*>(sink.out) + row * d_len;
    for (int64_t d = 0; d < d_len; ++d) dst[d] = static_cast<T>(f.o[d]);
  }
  sink.lse[row] = f.lse;
}

// Partials of tasks that hold one chunk of a tile whose chunks the threads share: slot s holds
// `rows` partials of D floats and their lse (-inf: the row saw none of its keys).
struct PartBuffer {
  std::vector<float> o, lse;
  int64_t d_len = 0;

  int64_t add(int64_t rows) {  // a new slot's first row
    const int64_t first = static_cast<int64_t>(lse.size());
    lse.resize(first + rows, -INFINITY);
    o.resize((first + rows) * d_len);
    return first;
  }
};

}  // namespace radixrt_paged
