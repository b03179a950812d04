// The paged attention kernel's arguments and tiles (paged_attention.cpp), and its decode
// tiles: one new token against its sequence's keys, vectorized over head_dim.
//
// The decode tile's arithmetic is the one every row follows (the general tile copies it lane
// by lane, attention_f32.h): a score is two chains of 8-float products over head_dim summed by
// hsum's tree; the softmax's sum adds the block's exponentials 8 keys at a time, then the same
// tree; P @ V adds the keys in order onto the rescaled sum. Chunks and blocks start at fixed
// key positions (attention_chunks.h).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "attention_chunks.h"
#include "vec8.h"

namespace radixrt_paged {

using namespace radixrt_vec8;

struct Args {
  const void* q;
  const void* k;
  const void* v;
  Sink sink;
  const int64_t* qo_indptr;
  const int64_t* kv_indptr;
  const int64_t* kv_indices;
  int64_t q_stride_t, q_stride_h;  // q [T, Hq, D] (out and lse are contiguous [T, Hq, D / 1])
  int64_t kv_stride_slot, kv_stride_head;
  int64_t hq, hkv, group, head_dim;
  float scale;
  bool causal;     // false: every row sees all of its sequence's keys (a shared prefix)
  int64_t window;  // > 0: a row at position p sees keys p - window + 1 .. p only (causal only)
  const float* init_o = nullptr;    // [T * Hq, D]: each row's shared prefix, folded (or none)
  const float* init_lse = nullptr;  // [T * Hq], -inf where a row has none
  PartBuffer* parts = nullptr;      // where tasks that hold one chunk of a tile put it
};

// Rows of one tile: tokens t0..t0+tokens-1 of sequence seq, query heads h0..h0+heads-1 of
// kv head kv_head's group; row r = (token t0 + r / heads, head h0 + r % heads). A task runs
// the tile's chunks c0..c1-1; `slot` >= 0: its one chunk's partials go to the part buffer's
// rows slot.., to be folded once every chunk is done (fold_buffered), else it folds them.
struct Tile {
  int64_t seq, kv_head, h0, heads, t0, tokens;
  double cost;
  int64_t c0 = 0, c1 = 1;
  int64_t slot = -1;

  int64_t rows() const { return heads * tokens; }
};

// Where a tile's keys lie: its first token's position, how far each next token sees, one past
// the last key any of its rows sees, and the block where the first of its rows starts.
struct Span {
  int64_t first_pos, step, key_end, key_begin;
};

inline Span span_of(const Args& a, const Tile& t) {
  const int64_t n_new = a.qo_indptr[t.seq + 1] - a.qo_indptr[t.seq];
  const int64_t kv_len = a.kv_indptr[t.seq + 1] - a.kv_indptr[t.seq];
  const int64_t first_pos = a.causal ? kv_len - n_new + t.t0 : kv_len - 1;
  const int64_t step = a.causal ? 1 : 0;
  const int64_t key_begin =
      a.window > 0 ? std::max<int64_t>(0, first_pos - a.window + 1) / kKeyBlock * kKeyBlock : 0;
  return {first_pos, step, first_pos + step * (t.tokens - 1) + 1, key_begin};
}

// The chunks a tile's rows see (a sliding window's band is one chunk: it is never long).
inline int64_t chunk_count(const Args& a, const Span& s) {
  return a.window > 0 ? 1 : (s.key_end + kKeyChunk - 1) / kKeyChunk;
}

inline std::pair<int64_t, int64_t> chunk_keys(const Args& a, const Span& s, int64_t c) {
  if (a.window > 0) return {s.key_begin, s.key_end};
  return {c * kKeyChunk, std::min((c + 1) * kKeyChunk, s.key_end)};
}

// Row r of tile t as an index into out and lse ([T * Hq]), and its q.
inline int64_t row_index(const Args& a, const Tile& t, int64_t r) {
  const int64_t token = a.qo_indptr[t.seq] + t.t0 + r / t.heads;
  return token * a.hq + t.kv_head * a.group + t.h0 + r % t.heads;
}

inline int64_t q_offset(const Args& a, int64_t row) {
  return row / a.hq * a.q_stride_t + row % a.hq * a.q_stride_h;
}

// A chunk's partial for row r of the tile (o: its D floats, normalized): folded into the
// row's running result, or put in the part buffer.
inline void take_part(const Args& a, const Tile& t, int64_t r, RowFold& fold, const float* o,
                      float lse) {
  if (t.slot < 0) return fold_part(fold.o, fold.lse, o, lse, a.head_dim);
  const int64_t at = t.slot + r;
  a.parts->lse[at] = lse;
  std::memcpy(a.parts->o.data() + at * a.head_dim, o, a.head_dim * sizeof(float));
}

// Decode tiles (one new token, the G <= 8 query heads of one kv head): scores and the output
// are vectorized over head_dim, and each key's K and V vectors are loaded once for all G heads.
constexpr int kMaxDecodeHeads = 8;

template <typename T, int DV>  // DV = head_dim / 8
void decode_tile(const Args& a, const Tile& tile) {
  const int g_len = static_cast<int>(tile.heads);
  const Span span = span_of(a, tile);
  const int64_t first_seen = a.window > 0 ? span.first_pos - a.window + 1 : 0;
  const int64_t* slots = a.kv_indices + a.kv_indptr[tile.seq];
  const int64_t kv_off = tile.kv_head * a.kv_stride_head;
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  v8f qs[kMaxDecodeHeads][DV], o[kMaxDecodeHeads][DV];
  float m[kMaxDecodeHeads], l[kMaxDecodeHeads];
  alignas(32) float p[kMaxDecodeHeads][kKeyBlock];
  alignas(32) float part[kMaxDecodeHeads][DV * kLanes], acc[kMaxDecodeHeads][DV * kLanes];
  RowFold fold[kMaxDecodeHeads];
  for (int g = 0; g < g_len; ++g) {
    const int64_t row = row_index(a, tile, g);
    const T* q = static_cast<const T*>(a.q) + q_offset(a, row);
    for (int dv = 0; dv < DV; ++dv) qs[g][dv] = load8(q + dv * kLanes) * a.scale;
    fold[g].o = acc[g];
    fold[g].start(a.init_o, a.init_lse, row, a.head_dim);
  }
  for (int64_t c = tile.c0; c < tile.c1; ++c) {
    const auto [k_lo, k_hi] = chunk_keys(a, span, c);
    for (int g = 0; g < g_len; ++g) {
      for (int dv = 0; dv < DV; ++dv) o[g][dv] = splat(0.0f);
      m[g] = -INFINITY;
      l[g] = 0.0f;
    }
    for (int64_t j0 = k_lo; j0 < k_hi; j0 += kKeyBlock) {
      const int kb = static_cast<int>(std::min<int64_t>(kKeyBlock, k_hi - j0));
      for (int j = 0; j < kb; ++j) {  // scores
        const T* kj = k + slots[j0 + j] * a.kv_stride_slot + kv_off;
        v8f kv[DV];
        for (int dv = 0; dv < DV; ++dv) kv[dv] = load8(kj + dv * kLanes);
        for (int g = 0; g < g_len; ++g) {
          v8f acc0 = qs[g][0] * kv[0], acc1 = qs[g][1] * kv[1];
          for (int dv = 2; dv < DV; dv += 2) {
            acc0 = fmadd(qs[g][dv], kv[dv], acc0);
            acc1 = fmadd(qs[g][dv + 1], kv[dv + 1], acc1);
          }
          p[g][j] = j0 + j < first_seen ? -INFINITY : hsum(acc0 + acc1);
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
        const T* vj = v + slots[j0 + j] * a.kv_stride_slot + kv_off;
        v8f vv[DV];
        for (int dv = 0; dv < DV; ++dv) vv[dv] = load8(vj + dv * kLanes);
        for (int g = 0; g < g_len; ++g) {
          const v8f pj = splat(p[g][j]);
          for (int dv = 0; dv < DV; ++dv) o[g][dv] = fmadd(pj, vv[dv], o[g][dv]);
        }
      }
    }
    for (int g = 0; g < g_len; ++g) {
      const float inv = 1.0f / l[g];
      for (int dv = 0; dv < DV; ++dv) {
        const v8f x = o[g][dv] * inv;
        std::memcpy(part[g] + dv * kLanes, &x, sizeof(x));
      }
      take_part(a, tile, g, fold[g], part[g], m[g] + std::log(l[g]));
    }
  }
  if (tile.slot >= 0) return;
  for (int g = 0; g < g_len; ++g) write_row<T>(a.sink, row_index(a, tile, g), fold[g], a.head_dim);
}

template <typename T>
bool try_decode_tile(const Args& a, const Tile& tile) {
  const bool decode = tile.tokens == 1 && tile.heads <= kMaxDecodeHeads &&
                      a.qo_indptr[tile.seq + 1] - a.qo_indptr[tile.seq] == 1;
  if (!decode) return false;
  switch (a.head_dim) {
    case 64: decode_tile<T, 8>(a, tile); return true;
    case 128: decode_tile<T, 16>(a, tile); return true;
    default: return false;
  }
}

}  // namespace radixrt_paged
