// Paged attention on the CPU: every new token of a ragged batch against its sequence's keys,
// read in place from the KV pool by slot index (no gather copy, no padding to the longest).
//
// Sequence b owns q rows qo_indptr[b]:qo_indptr[b+1] (n new tokens) and keys at the pool slots
// kv_indices[kv_indptr[b]:kv_indptr[b+1]] (L keys, position order). New token t sits at
// position L - n + t and sees keys 0..L - n + t (bottom-right aligned causal), so one kernel
// covers decode (n = 1), a few tokens after a cached prefix, and a prefill chunk. A sliding
// window W > 0 (Gemma 3's local layers) narrows that to keys p - W + 1 .. p for a token at p.
//
// A row's result depends on its own sequence only: chunks and blocks of keys start at fixed
// positions and partials fold in a fixed order (attention_chunks.h), and both tiles add up in
// one order (paged_decode.h). Cascades: rows of several sequences that share a prefix of whole
// chunks (cascade_slots) attend to it in one pass, its slots read once per tile of rows; each
// such row's own keys (kv_indices, after the prefix) then fold onto that.
//
// Layout of the general tile: up to 4 vectors of query rows that share one kv head (tokens x
// the G query heads of that kv head, GQA): 32 rows, or 64 with AVX-512's 16-float vectors,
// held transposed so that one SIMD lane is one row. Scores, the online softmax and the P @ V
// update are then all lane-parallel: each K/V element is loaded once per tile and broadcast
// against a vector of rows at a time (attention_f32.h). Tiles are scheduled longest first over
// OpenMP threads, which balances unequal lengths; a batch with too few tiles for the threads
// gives each chunk of a tile to a task of its own.
#pragma GCC optimize("fp-contract=off")
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "attention_chunks.h"
#include "attention_f32.h"
#include "attention_tasks.h"
#include "ops.h"
#include "paged_decode.h"
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
// (scores, then probabilities), Ot [D][NR] (the unnormalized output); a chunk's partial of one
// row, and each row's running fold. Sized on first use: decode tiles need none of them.
struct Scratch {
  std::vector<vtile> qt, st, ot;
  std::vector<float> part, acc;
  void ensure(int64_t d) {
    if (!qt.empty()) return;
    qt.resize(d * kMaxRows / kTileLanes);
    st.resize(kKeyBlock * kMaxRows / kTileLanes);
    ot.resize(d * kMaxRows / kTileLanes);
    part.resize(d);
    acc.resize(d * kMaxRows);
  }
};

// Online softmax over one block of scores: masks keys past each row's position (and, with a
// window, at or below `floor`), updates the running max m and sum l, turns St into
// probabilities and returns the rescale of the old ones. The sum adds the block's keys 8 at a
// time and then by hsum's tree, as the decode tile does. A row that sees none of the block's
// keys keeps m, l and its output exactly: alpha 1, probabilities 0 (from base 0 while it has
// seen nothing, so that exp(-inf - -inf) never makes a NaN).
template <int NR>
void softmax_block(int kb, int64_t j0, bool needs_mask, const vtile* limit, const vtile* floor,
                   vtile* st, vtile* m, vtile* l, vtile* alpha) {
  const vtile neg_inf = splat<vtile>(-INFINITY), zero = splat<vtile>(0.0f);
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
    const vtile m_new = vmax(m[r], block_max);
    const vtile base = m_new == neg_inf ? zero : m_new;
    alpha[r] = block_max == neg_inf ? splat<vtile>(1.0f) : vexp(m[r] - m_new);
    vtile eighths[8];
    for (int i = 0; i < 8; ++i) eighths[i] = zero;
    for (int j = 0; j < kb; ++j) {
      const vtile p = vexp(st[j * NR + r] - base);
      st[j * NR + r] = p;
      eighths[j % 8] += p;
    }
    const vtile sum = ((eighths[0] + eighths[4]) + (eighths[2] + eighths[6])) +
                      ((eighths[1] + eighths[5]) + (eighths[3] + eighths[7]));
    l[r] = l[r] * alpha[r] + sum;
    m[r] = m_new;
  }
}

// The tile's rows over keys [k_lo, k_hi) in blocks from k_lo: Ot, m and l of each lane.
template <typename T, int NR>
void attend_keys(const Args& a, const Tile& tile, const Span& span, int64_t k_lo, int64_t k_hi,
                 const vtile* limit, const vtile* floor, Scratch& s, vtile* m, vtile* l) {
  const int64_t d_len = a.head_dim;
  const int64_t* slots = a.kv_indices + a.kv_indptr[tile.seq];
  const int64_t kv_off = tile.kv_head * a.kv_stride_head;
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  for (int r = 0; r < NR; ++r) {
    m[r] = splat<vtile>(-INFINITY);
    l[r] = splat<vtile>(0.0f);
  }
  std::fill(s.ot.begin(), s.ot.begin() + d_len * NR, splat<vtile>(0.0f));
  vtile alpha[NR];
  const T* kp[kKeyBlock];
  const T* vp[kKeyBlock];
  for (int64_t j0 = k_lo; j0 < k_hi; j0 += kKeyBlock) {
    const int kb = static_cast<int>(std::min<int64_t>(kKeyBlock, k_hi - j0));
    for (int j = 0; j < kb; ++j) {
      kp[j] = k + slots[j0 + j] * a.kv_stride_slot + kv_off;
      vp[j] = v + slots[j0 + j] * a.kv_stride_slot + kv_off;
    }
    const bool needs_mask = j0 + kb - 1 > span.first_pos ||
                            (floor != nullptr && j0 <= span.key_end - 1 - a.window);
    score_block<T, NR>(kp, kb, d_len, s.qt.data(), s.st.data());
    softmax_block<NR>(kb, j0, needs_mask, limit, floor, s.st.data(), m, l, alpha);
    accumulate_block<T, NR>(vp, kb, d_len, s.st.data(), alpha, s.ot.data());
  }
}

template <typename T, int NR>
void attend_tile(const Args& a, const Tile& tile, Scratch& s) {
  const int64_t d_len = a.head_dim;
  const Span span = span_of(a, tile);
  const int rows = static_cast<int>(tile.rows());
  // Transposed, pre-scaled queries; padding lanes are zero and copy the last row's position.
  float* qt = reinterpret_cast<float*>(s.qt.data());
  vtile limit[NR], floor[NR], m[NR], l[NR];
  float* lim = reinterpret_cast<float*>(limit);
  float* low = reinterpret_cast<float*>(floor);
  for (int r = 0; r < NR * kTileLanes; ++r) {
    const int rr = std::min(r, rows - 1);
    lim[r] = static_cast<float>(span.first_pos + span.step * (rr / tile.heads));
    low[r] = lim[r] - static_cast<float>(a.window);
    const T* src = static_cast<const T*>(a.q) + q_offset(a, row_index(a, tile, rr));
    for (int64_t d = 0; d < d_len; ++d)
      qt[d * NR * kTileLanes + r] = r < rows ? to_float(src[d]) * a.scale : 0.0f;
  }
  std::vector<RowFold> fold(rows);
  for (int r = 0; r < rows; ++r) {
    fold[r].o = s.acc.data() + r * d_len;
    fold[r].start(a.init_o, a.init_lse, row_index(a, tile, r), d_len);
  }
  const float* ot = reinterpret_cast<const float*>(s.ot.data());
  const float* lf = reinterpret_cast<const float*>(l);
  const float* mf = reinterpret_cast<const float*>(m);
  for (int64_t c = tile.c0; c < tile.c1; ++c) {
    const auto [k_lo, k_hi] = chunk_keys(a, span, c);
    attend_keys<T, NR>(a, tile, span, k_lo, k_hi, limit, a.window > 0 ? floor : nullptr, s, m, l);
    for (int r = 0; r < rows; ++r) {
      const float inv = 1.0f / lf[r];
      for (int64_t d = 0; d < d_len; ++d) s.part[d] = ot[d * NR * kTileLanes + r] * inv;
      const float lse = lf[r] == 0.0f ? -INFINITY : mf[r] + std::log(lf[r]);
      take_part(a, tile, r, fold[r], s.part.data(), lse);
    }
  }
  if (tile.slot >= 0) return;
  for (int r = 0; r < rows; ++r) write_row<T>(a.sink, row_index(a, tile, r), fold[r], d_len);
}

template <typename T>
void attend(const Args& a, const Tile& tile, Scratch& s) {
  if (try_decode_tile<T>(a, tile)) return;
  s.ensure(a.head_dim);
  switch ((tile.rows() + kTileLanes - 1) / kTileLanes) {
    case 1: return attend_tile<T, 1>(a, tile, s);
    case 2: return attend_tile<T, 2>(a, tile, s);
    case 3: return attend_tile<T, 3>(a, tile, s);
    default: return attend_tile<T, 4>(a, tile, s);
  }
}

template <typename T>
void run_tiles(Args& a, int64_t batch) {
  std::vector<Tile> tiles = plan_tiles(a, batch, kMaxRows);
  double cost = 0;
  for (const Tile& t : tiles) cost += t.cost;
  const int64_t most = cost < kMinParallelCost ? 1 : at::get_num_threads();
  PartBuffer parts;
  parts.d_len = a.head_dim;
  a.parts = &parts;
  std::vector<Tile> tasks = split_chunks(std::move(tiles), most, parts);
  std::vector<Tile> order = tasks;
  std::stable_sort(order.begin(), order.end(),
                   [](const Tile& x, const Tile& y) { return x.cost > y.cost; });
  const int64_t count = static_cast<int64_t>(order.size());
  const int threads = static_cast<int>(std::clamp<int64_t>(count, 1, most));
#pragma omp parallel num_threads(threads)
  {
    Scratch s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) attend<T>(a, order[i], s);
  }
  if (!parts.lse.empty()) fold_buffered<T>(a, tasks);
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

// out and lse for q's rows against their sequences' keys (causal: bottom-right aligned), each
// row's fold started from init where given; out in q's dtype, or float32 for float_out.
std::tuple<at::Tensor, at::Tensor> attend_all(const at::Tensor& q_in, const at::Tensor& k_cache,
                                              const at::Tensor& v_cache,
                                              const at::Tensor& qo_indptr,
                                              const at::Tensor& kv_indptr,
                                              const at::Tensor& kv_indices, double scale,
                                              bool causal, int64_t window,
                                              const at::Tensor& init_o, const at::Tensor& init_lse,
                                              bool float_out) {
  const at::Tensor q = q_in.contiguous();
  at::Tensor out = float_out ? at::empty(q.sizes(), q.options().dtype(at::kFloat))
                             : at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  Args a{q.data_ptr(),           k_cache.data_ptr(),         v_cache.data_ptr(),
         Sink{out.data_ptr(), lse.data_ptr<float>(), float_out},
         qo_indptr.data_ptr<int64_t>(), kv_indptr.data_ptr<int64_t>(),
         kv_indices.data_ptr<int64_t>(), q.stride(0),
         q.stride(1),            k_cache.stride(0),          k_cache.stride(1),
         q.size(1),              k_cache.size(1),            q.size(1) / k_cache.size(1),
         q.size(2),              static_cast<float>(scale),  causal,
         window};
  if (init_o.defined()) {
    a.init_o = init_o.data_ptr<float>();
    a.init_lse = init_lse.data_ptr<float>();
  }
  const int64_t batch = qo_indptr.numel() - 1;
  switch (q.scalar_type()) {
    case at::kFloat: run_tiles<float>(a, batch); break;
    case at::kBFloat16: run_tiles<c10::BFloat16>(a, batch); break;
    case at::kHalf: run_tiles<c10::Half>(a, batch); break;
    default: TORCH_CHECK(false, "paged_attention: dtype must be float32, bfloat16 or float16");
  }
  return {out, lse};
}

// Each cascade's rows against its shared prefix (whole chunks, unmasked), folded per row:
// float32 [T, Hq, D] and lse [T, Hq] (-inf for rows in no cascade), where the rows' own keys
// then fold on.
std::pair<at::Tensor, at::Tensor> shared_prefixes(const at::Tensor& q, const at::Tensor& k_cache,
                                                  const at::Tensor& v_cache,
                                                  at::TensorList rows, at::TensorList slots,
                                                  double scale) {
  at::Tensor init_o = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
  at::Tensor init_lse = at::full({q.size(0), q.size(1)}, -INFINITY, init_o.options());
  for (size_t c = 0; c < rows.size(); ++c) {
    const at::Tensor bounds = at::tensor({int64_t{0}, rows[c].numel()}, rows[c].options());
    const at::Tensor keys = at::tensor({int64_t{0}, slots[c].numel()}, rows[c].options());
    check_inputs(q, k_cache, v_cache, bounds, keys, slots[c]);
    TORCH_CHECK(rows[c].scalar_type() == at::kLong && rows[c].dim() == 1,
                "paged_attention: cascade_rows must be 1-d int64");
    TORCH_CHECK(slots[c].numel() % kKeyChunk == 0,
                "paged_attention: a cascade's prefix must be whole chunks of ", kKeyChunk,
                " keys, got ", slots[c].numel());
    if (rows[c].numel() == 0 || slots[c].numel() == 0) continue;
    const auto [o, lse] = attend_all(q.index_select(0, rows[c]), k_cache, v_cache, bounds, keys,
                                     slots[c], scale, false, 0, {}, {}, true);
    init_o.index_copy_(0, rows[c], o);
    init_lse.index_copy_(0, rows[c], lse);
  }
  return {init_o, init_lse};
}

}  // namespace

namespace radixrt {

std::tuple<at::Tensor, at::Tensor> paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                                   const at::Tensor& v_cache,
                                                   const at::Tensor& qo_indptr,
                                                   const at::Tensor& kv_indptr,
                                                   const at::Tensor& kv_indices, double scale,
                                                   int64_t window, at::TensorList cascade_rows,
                                                   at::TensorList cascade_slots) {
  check_inputs(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices);
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0 (0: no sliding window)");
  TORCH_CHECK(cascade_rows.size() == cascade_slots.size(),
              "paged_attention: one slot list per cascade's rows");
  TORCH_CHECK(window == 0 || cascade_rows.empty(),
              "paged_attention: a sliding window takes no cascade");
  if (cascade_rows.empty())
    return attend_all(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, scale, true, window,
                      {}, {}, false);
  const auto [init_o, init_lse] =
      shared_prefixes(q, k_cache, v_cache, cascade_rows, cascade_slots, scale);
  return attend_all(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, scale, true, 0,
                    init_o, init_lse, false);
}

int64_t attention_key_chunk() { return radixrt_paged::kKeyChunk; }

}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor qo_indptr, "
      "Tensor kv_indptr, Tensor kv_indices, float scale, int window, "
      "Tensor[] cascade_rows, Tensor[] cascade_slots) -> (Tensor, Tensor)");
  m.def("attention_key_chunk() -> int");
}

TORCH_LIBRARY_IMPL(radixrt, CPU, m) {
  m.impl("paged_attention", radixrt::paged_attention);
}

TORCH_LIBRARY_IMPL(radixrt, CompositeExplicitAutograd, m) {
  m.impl("attention_key_chunk", radixrt::attention_key_chunk);
}
