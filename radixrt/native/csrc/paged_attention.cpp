// Paged attention on the CPU: every new token of a ragged batch against its sequence's keys,
// read in place from the KV pool by slot index (no gather copy, no padding to the longest).
//
// Sequence b owns q rows qo_indptr[b]:qo_indptr[b+1] (n new tokens) and keys at the pool slots
// kv_indices[kv_indptr[b]:kv_indptr[b+1]] (L keys, position order). New token t sits at
// position L - n + t and sees keys 0..L - n + t (bottom-right aligned causal), so one kernel
// covers decode (n = 1), a few tokens after a cached prefix, and a prefill chunk. A sliding
// window W > 0 (Gemma 3's local layers) narrows that to keys p - W + 1 .. p for a token at p:
// the key loop starts at the first key the tile's first token sees, and the mask cuts the band.
//
// cascade_attention runs the same tiles without the mask: chosen rows of a batch against one
// prefix that their sequences share (slots read once per tile of rows, not once per sequence),
// merged through the log-sum-exp into what paged_attention gave them for their own keys.
//
// Layout of the work: a tile is up to 4 vectors of query rows that share one kv head (tokens x
// the G query heads of that kv head, GQA): 32 rows, or 64 with AVX-512's 16-float vectors,
// held transposed so that one SIMD lane is one row. Scores, the online softmax and the P @ V
// update are then all lane-parallel: each K/V element is loaded once per tile and broadcast
// against a vector of rows at a time, and no horizontal reduction is needed. The products are
// float32 FMAs (attention_f32.h), or bfloat16 pair dot products for a bfloat16 pool where the
// CPU has AVX-512 BF16 (attention_bf16.h). Tiles are scheduled longest first over OpenMP
// threads, which balances unequal lengths.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_bf16.h"
#include "attention_f32.h"
#include "attention_split.h"
#include "paged_decode.h"
#include "ops.h"
#include "vec8.h"

namespace {

using namespace radixrt_vec8;
using namespace radixrt_tile;
using namespace radixrt_paged;

// Below this much work (the tiles' summed cost, ~ keys x rows) the batch runs on the calling
// thread: a batch-1 decode over a short context is a few microseconds of arithmetic, less than
// waking another thread costs.
constexpr double kMinParallelCost = 4096;

constexpr int kMaxRows = 4 * kTileLanes;  // rows per tile: 4 vectors, leaving registers free

// Per-thread buffers, [index][row vector]: Qt is [D][NR] (q transposed), St [kKeyBlock][NR]
// (scores, then probabilities), Ot [D][NR] (the unnormalized output). Sized on first use:
// decode tiles need none of them.
struct Scratch {
  std::vector<vtile> qt, st, ot;
#ifdef RADIXRT_BF16_DOT
  // The bfloat16 tile's pairs (attention_bf16.h): q [D / 2][NR], probabilities
  // [kKeyBlock / 2][NR], values [kKeyBlock / 2][D].
  std::vector<__m512i> q2, p2;
  std::vector<uint32_t> v2;
#endif
  void ensure(int64_t d) {
    if (!qt.empty()) return;
    qt.resize(d * kMaxRows / kTileLanes);
    st.resize(kKeyBlock * kMaxRows / kTileLanes);
    ot.resize(d * kMaxRows / kTileLanes);
#ifdef RADIXRT_BF16_DOT
    q2.resize(d / 2 * kMaxRows / kTileLanes);
    p2.resize(kKeyBlock / 2 * kMaxRows / kTileLanes);
    v2.resize(kKeyBlock / 2 * d);
#endif
  }
};

// Online softmax over one block of scores: masks keys past each row's position, updates the
// running max m and sum l, turns St into probabilities and returns the rescale of the old ones.
// With a window, keys at or below `floor` are masked too, and a row that has seen no key yet
// keeps m = -inf: its max is taken as 0 so that exp(-inf - -inf) never makes a NaN.
template <int NR>
void softmax_block(int kb, int64_t j0, bool needs_mask, const vtile* limit, const vtile* floor,
                   vtile* st, vtile* m, vtile* l, vtile* alpha) {
  const vtile neg_inf = splat<vtile>(-INFINITY);
  for (int r = 0; r < NR; ++r) {
    vtile block_max = neg_inf;
    for (int j = 0; j < kb; ++j) {
      vtile s = st[j * NR + r];
      if (needs_mask) {
        const vtile key = splat<vtile>(static_cast<float>(j0 + j));
        s = key <= limit[r] ? s : neg_inf;
        if (floor != nullptr) s = key > floor[r] ? s : neg_inf;
      }
      st[j * NR + r] = s;
      block_max = vmax(block_max, s);
    }
    vtile m_new = vmax(m[r], block_max);
    if (floor != nullptr) m_new = m_new == neg_inf ? splat<vtile>(0.0f) : m_new;
    alpha[r] = vexp(m[r] - m_new);
    vtile sum = splat<vtile>(0.0f);
    for (int j = 0; j < kb; ++j) {
      const vtile p = vexp(st[j * NR + r] - m_new);
      st[j * NR + r] = p;
      sum += p;
    }
    l[r] = l[r] * alpha[r] + sum;
    m[r] = m_new;
  }
}

template <typename T, int NR>
void attend_tile(const Args& a, const Tile& tile, Scratch& s) {
  const int64_t d_len = a.head_dim;
  const int64_t n_new = a.qo_indptr[tile.seq + 1] - a.qo_indptr[tile.seq];
  const int64_t kv_len = a.kv_indptr[tile.seq + 1] - a.kv_indptr[tile.seq];
  const int64_t* slots = a.kv_indices + a.kv_indptr[tile.seq];
  // Position of the tile's first token, and how far each next token sees (unmasked: all keys).
  const int64_t first_pos = a.causal ? kv_len - n_new + tile.t0 : kv_len - 1;
  const int64_t token_step = a.causal ? 1 : 0;
  const int rows = static_cast<int>(tile.heads * tile.tokens);
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);

  auto q_offset = [&](int r) {
    const int64_t t = a.qo_indptr[tile.seq] + tile.t0 + r / tile.heads;
    const int64_t h = tile.kv_head * a.group + tile.h0 + r % tile.heads;
    return t * a.q_stride_t + h * a.q_stride_h;
  };
  // Transposed, pre-scaled queries (paired, unscaled for kPairs); padding lanes are zero and
  // copy the last row's position.
  float* qt = reinterpret_cast<float*>(s.qt.data());
  vtile limit[NR], floor[NR], m[NR], l[NR], alpha[NR];
  float* lim = reinterpret_cast<float*>(limit);
  float* low = reinterpret_cast<float*>(floor);
  for (int r = 0; r < NR * kTileLanes; ++r) {
    const int rr = std::min(r, rows - 1);
    lim[r] = static_cast<float>(first_pos + token_step * (rr / tile.heads));
    low[r] = lim[r] - static_cast<float>(a.window);
    const T* src = q + q_offset(rr);
#ifdef RADIXRT_BF16_DOT
    if constexpr (kPairs<T>) {
      uint32_t* q2 = reinterpret_cast<uint32_t*>(s.q2.data());
      for (int64_t p = 0; p < d_len / 2; ++p)
        q2[p * NR * kTileLanes + r] = r < rows ? radixrt_bf16::pair_at(src + 2 * p) : 0u;
      continue;
    }
#endif
    for (int64_t d = 0; d < d_len; ++d)
      qt[d * NR * kTileLanes + r] = r < rows ? to_float(src[d]) * a.scale : 0.0f;
  }
  for (int r = 0; r < NR; ++r) {
    m[r] = splat<vtile>(-INFINITY);
    l[r] = splat<vtile>(0.0f);
  }
  std::fill(s.ot.begin(), s.ot.begin() + d_len * NR, splat<vtile>(0.0f));

  // One past the last key, and the first key the tile's first token sees (the band's other
  // edge is masked per row); a chunk of the keys only its range (attention_split.h).
  const int64_t key_end = std::min(first_pos + token_step * (tile.tokens - 1) + 1, tile.k1);
  const int64_t key_begin =
      a.window > 0 ? std::max<int64_t>(0, first_pos - a.window + 1) : tile.k0;
  const vtile* band = a.window > 0 ? floor : nullptr;
  const T* kp[kKeyBlock];
  const T* vp[kKeyBlock];
  for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
    const int kb = static_cast<int>(std::min<int64_t>(kKeyBlock, key_end - j0));
    for (int j = 0; j < kb; ++j) {
      const int64_t off = slots[j0 + j] * a.kv_stride_slot + tile.kv_head * a.kv_stride_head;
      kp[j] = k + off;
      vp[j] = v + off;
    }
    const bool needs_mask =
        j0 + kb - 1 > first_pos || (band != nullptr && j0 <= key_end - 1 - a.window);
#ifdef RADIXRT_BF16_DOT
    if constexpr (kPairs<T>) {
      using namespace radixrt_bf16;
      constexpr int C = chains<NR>();
      score_pairs<NR, C>(kp, kb, d_len / 2, s.q2.data(), a.scale, s.st.data());
      softmax_block<NR>(kb, j0, needs_mask, limit, band, s.st.data(), m, l, alpha);
      pair_probabilities<NR>(kb, s.st.data(), s.p2.data());
      pair_values(vp, kb, d_len, s.v2.data());
      accumulate_all_pairs<NR, C>(kb, d_len, s.p2.data(), s.v2.data(), alpha, s.ot.data());
      continue;
    }
#endif
    score_block<T, NR>(kp, kb, d_len, s.qt.data(), s.st.data());
    softmax_block<NR>(kb, j0, needs_mask, limit, band, s.st.data(), m, l, alpha);
    accumulate_block<T, NR>(vp, kb, d_len, s.st.data(), alpha, s.ot.data());
  }

  const float* ot = reinterpret_cast<const float*>(s.ot.data());
  const float* lf = reinterpret_cast<const float*>(l);
  const float* mf = reinterpret_cast<const float*>(m);
  T* out = static_cast<T*>(a.out);
  for (int r = 0; r < rows; ++r) {
    const int64_t off = q_offset(r);
    const float inv = 1.0f / lf[r];
    for (int64_t d = 0; d < d_len; ++d) out[off + d] = static_cast<T>(ot[d * NR * kTileLanes + r] * inv);
    a.lse[off / d_len] = mf[r] + std::log(lf[r]);
  }
}

template <typename T>
void attend(const Args& a, const Tile& tile, Scratch& s) {
  if (try_decode_tile<T>(a, tile)) return;
  s.ensure(a.head_dim);
  switch ((tile.heads * tile.tokens + kTileLanes - 1) / kTileLanes) {
    case 1: return attend_tile<T, 1>(a, tile, s);
    case 2: return attend_tile<T, 2>(a, tile, s);
    case 3: return attend_tile<T, 3>(a, tile, s);
    default: return attend_tile<T, 4>(a, tile, s);
  }
}

// Tiles of at most kMaxRows rows, longest (rows x visible keys) first.
std::vector<Tile> plan_tiles(const Args& a, int64_t batch) {
  const int64_t heads = std::min<int64_t>(a.group, kMaxRows);
  const int64_t tokens_per_tile = std::max<int64_t>(1, kMaxRows / heads);
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = a.qo_indptr[b + 1] - a.qo_indptr[b];
    const int64_t len = a.kv_indptr[b + 1] - a.kv_indptr[b];
    for (int64_t kv = 0; kv < a.hkv; ++kv)
      for (int64_t h0 = 0; h0 < a.group; h0 += heads)
        for (int64_t t0 = 0; t0 < n; t0 += tokens_per_tile) {
          const int64_t hc = std::min(heads, a.group - h0);
          const int64_t tc = std::min(tokens_per_tile, n - t0);
          double keys = static_cast<double>(a.causal ? len - n + t0 + tc : len);
          if (a.window > 0) keys = std::min(keys, static_cast<double>(a.window + tc));
          tiles.push_back({b, kv, h0, hc, t0, tc, keys * static_cast<double>(hc * tc + 8)});
        }
  }
  std::sort(tiles.begin(), tiles.end(),
            [](const Tile& x, const Tile& y) { return x.cost > y.cost; });
  return tiles;
}

void check_inputs(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                  const at::Tensor& kv_indices) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3,
              "paged_attention: q [T, Hq, D], k_cache/v_cache [pool, Hkv, D]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "paged_attention: k_cache and v_cache differ");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "paged_attention: q, k_cache and v_cache must share one dtype");
  TORCH_CHECK(k_cache.size(2) == q.size(2) && q.size(2) % 2 == 0,
              "paged_attention: head_dim must match and be even");
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0, "paged_attention: Hq must be a multiple of Hkv");
  TORCH_CHECK(k_cache.stride(2) == 1 && v_cache.stride(2) == 1 &&
                  k_cache.strides() == v_cache.strides(),
              "paged_attention: k_cache/v_cache need unit stride in head_dim and equal strides");
  for (const auto* t : {&qo_indptr, &kv_indptr, &kv_indices})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous(),
                "paged_attention: qo_indptr, kv_indptr, kv_indices must be contiguous int64");
  TORCH_CHECK(qo_indptr.numel() == kv_indptr.numel() && qo_indptr.numel() >= 1,
              "paged_attention: qo_indptr and kv_indptr must both be [B+1]");
}

// out and lse for q's rows against their sequences' keys (causal: bottom-right aligned).
std::tuple<at::Tensor, at::Tensor> attend_all(const at::Tensor& q_in, const at::Tensor& k_cache,
                                              const at::Tensor& v_cache,
                                              const at::Tensor& qo_indptr,
                                              const at::Tensor& kv_indptr,
                                              const at::Tensor& kv_indices, double scale,
                                              bool causal, int64_t window) {
  const at::Tensor q = q_in.contiguous();
  at::Tensor out = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  Args a{q.data_ptr(),           k_cache.data_ptr(),         v_cache.data_ptr(),
         out.data_ptr(),         lse.data_ptr<float>(),      qo_indptr.data_ptr<int64_t>(),
         kv_indptr.data_ptr<int64_t>(), kv_indices.data_ptr<int64_t>(), q.stride(0),
         q.stride(1),            k_cache.stride(0),          k_cache.stride(1),
         q.size(1),              k_cache.size(1),            q.size(1) / k_cache.size(1),
         q.size(2),              static_cast<float>(scale),  causal,
         window};
  std::vector<Tile> tiles = plan_tiles(a, qo_indptr.numel() - 1);
  double cost = 0;
  for (const Tile& t : tiles) cost += t.cost;
  const int64_t most = cost < kMinParallelCost ? 1 : at::get_num_threads();
  const int64_t chunks = key_chunks(static_cast<int64_t>(tiles.size()), most);
  // Chunk c > 0 of a tile's keys writes its rows' partial results to part c - 1, whose rows
  // start at lse -inf and out 0 (rows of a tile left whole merge unchanged).
  std::vector<Args> args(chunks, a);
  std::vector<at::Tensor> part_out, part_lse;
  if (chunks > 1) {
    tiles = split_keys(a, tiles, chunks);
    for (int64_t c = 1; c < chunks; ++c) {
      part_out.push_back(at::zeros_like(out));
      part_lse.push_back(at::full_like(lse, -INFINITY));
      args[c].out = part_out.back().data_ptr();
      args[c].lse = part_lse.back().data_ptr<float>();
    }
  }
  const int64_t count = static_cast<int64_t>(tiles.size());
  const int threads = static_cast<int>(std::clamp<int64_t>(count, 1, most));
  auto run = [&](auto tag) {
    using T = decltype(tag);
#pragma omp parallel num_threads(threads)
    {
      Scratch s;
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < count; ++i) attend<T>(args[tiles[i].chunk], tiles[i], s);
    }
  };
  switch (q.scalar_type()) {
    case at::kFloat: run(float{}); break;
    case at::kBFloat16: run(c10::BFloat16{}); break;
    case at::kHalf: run(c10::Half{}); break;
    default: TORCH_CHECK(false, "paged_attention: dtype must be float32, bfloat16 or float16");
  }
  if (chunks > 1) {
    const at::Tensor all = at::arange(q.size(0), qo_indptr.options());
    for (int64_t c = 1; c < chunks; ++c) merge_any(out, lse, all, part_out[c - 1], part_lse[c - 1]);
  }
  return {out, lse};
}

}  // namespace

namespace radixrt {

std::tuple<at::Tensor, at::Tensor> paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                                   const at::Tensor& v_cache,
                                                   const at::Tensor& qo_indptr,
                                                   const at::Tensor& kv_indptr,
                                                   const at::Tensor& kv_indices, double scale,
                                                   int64_t window) {
  check_inputs(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices);
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0 (0: no sliding window)");
  return attend_all(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, scale, true, window);
}

void cascade_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& rows, const at::Tensor& prefix_slots, double scale,
                       at::Tensor& out, at::Tensor& lse) {
  const at::Tensor bounds = at::tensor({int64_t{0}, rows.numel()}, rows.options());
  const at::Tensor keys = at::tensor({int64_t{0}, prefix_slots.numel()}, rows.options());
  check_inputs(q, k_cache, v_cache, bounds, keys, prefix_slots);
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.is_contiguous(),
              "cascade_attention: rows must be contiguous int64");
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type() &&
                  out.is_contiguous() && lse.is_contiguous() && lse.scalar_type() == at::kFloat &&
                  lse.sizes() == q.sizes().slice(0, 2),
              "cascade_attention: out [T, Hq, D] in q's dtype and lse [T, Hq] float32, contiguous");
  if (rows.numel() == 0 || prefix_slots.numel() == 0) return;
  const auto [o_pre, lse_pre] =
      attend_all(q.index_select(0, rows), k_cache, v_cache, bounds, keys, prefix_slots, scale,
                 false, 0);
  merge_any(out, lse, rows, o_pre, lse_pre);
}

}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor qo_indptr, "
      "Tensor kv_indptr, Tensor kv_indices, float scale, int window=0) -> (Tensor, Tensor)");
  m.def(
      "cascade_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor rows, "
      "Tensor prefix_slots, float scale, Tensor(a!) out, Tensor(b!) lse) -> ()");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) {
  m.impl("paged_attention", radixrt::paged_attention);
  m.impl("cascade_attention", radixrt::cascade_attention);
}
