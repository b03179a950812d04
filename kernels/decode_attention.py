"""Decode attention over the paged KV pool, split along the KV length (flash-decoding).

One new query token per sequence. Keys and values are read where they lie in the pool, through
each sequence's slot list (`kv_indices[kv_indptr[b]:kv_indptr[b+1]]`, position order); nothing
is gathered into a contiguous copy.

Stage 1, grid (B, Hkv, S): program (b, h, s) takes the s-th of S equal chunks of sequence b's
keys for kv head h and all G = Hq / Hkv query heads that share it (K/V are read once per group),
and writes a partial output normalized by its own softmax sum plus that sum's log-sum-exp. With
a sliding window W > 0 the chunks cover only the last min(L, W) keys: the query, at position
L - 1, sees no earlier one, so none is read.
Stage 2, grid (B, Hq): merges the S partials of each head through their log-sum-exps. S comes
from the batch (`choose_num_splits`): few long sequences get many splits so the GPU fills up.
Accumulation is float32 whatever the input dtype; an empty chunk contributes nothing.

Plain-torch reference: `kernels.reference.decode_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixrt.kernels.common import dot_dtype, dot_precision

# A split must hold at least this many keys: shorter chunks cost more in the merge than they
# save. At most MAX_SPLITS (a power of two; split counts are rounded to one, which bounds the
# number of compiled variants of the merge kernel).
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 32
PROGRAMS_PER_SM = 4
# The split kernel's tiling: keys per block, and its launch settings. Three pipeline stages
# keep enough K/V loads in flight: on an H200 at batch 64 x 4,096 (bench_kernels.py --sweep)
# 4,048 GB/s (84% of HBM) against 2,949 with two; 128 keys per block or more splits were not
# faster (docs/gpu_h200.md).
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 3


@triton.jit
def _decode_split_kernel(
    Q, K, V, KV_indptr, KV_indices, Mid_O, Mid_LSE, scaling, num_splits, window,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr,
):  # fmt: skip
    # DOT: tl.dot operand dtype (see kernels.common.dot_dtype); IN: the activations' dtype.
    IN = Q.dtype.element_ty
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, BLOCK_H)  # query heads of this group, padded up to BLOCK_H
    heads = kv_head * GROUP + rows
    head_ok = rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    kv_start = tl.load(KV_indptr + b)
    seq_len = tl.load(KV_indptr + b + 1) - kv_start
    first = 0  # the first key the query (at position seq_len - 1) sees
    if WINDOWED:
        first = tl.maximum(seq_len - window, 0)
    chunk = tl.cdiv(seq_len - first, num_splits)  # the splits share the visible keys only
    lo = first + split * chunk
    hi = tl.minimum(lo + chunk, seq_len)

    q_ptrs = Q + b * stride_qb + heads[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptrs, mask=head_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of the scores
    denom = tl.zeros([BLOCK_H], tl.float32)  # running softmax sum
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        ok = pos < hi  # every block has at least one valid key, so each row's max is finite
        slot = tl.load(KV_indices + kv_start + pos, mask=ok, other=0).to(tl.int64)
        kv_mask = ok[:, None] & dim_ok[None, :]
        k = tl.load(
            K + slot[:, None] * stride_kt + kv_head * stride_kh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k.to(IN).to(DOT)), input_precision=PRECISION) * scaling
        s = tl.where(ok[None, :], s, float("-inf"))  # [BLOCK_H, BLOCK_N]
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        denom = denom * alpha + tl.sum(p, 1)
        v = tl.load(
            V + slot[:, None] * stride_vt + kv_head * stride_vh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )
        # p is rounded to the activations' dtype for the tensor cores, as flash attention does.
        acc = acc * alpha[:, None] + tl.dot(
            p.to(IN).to(DOT), v.to(IN).to(DOT), input_precision=PRECISION
        )
        m = m_new

    # Mid_O [B, Hq, S, D] and Mid_LSE [B, Hq, S], contiguous. An empty chunk (denom 0) stores
    # output 0 and log-sum-exp -inf, which the merge weighs 0.
    empty = denom == 0.0
    o = acc / tl.where(empty, 1.0, denom)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, denom)))
    row = (b * GROUP * tl.num_programs(1) + heads) * num_splits + split  # [BLOCK_H]
    tl.store(
        Mid_O + row[:, None] * HEAD_DIM + dims[None, :], o, mask=head_ok[:, None] & dim_ok[None, :]
    )
    tl.store(Mid_LSE + row, lse, mask=head_ok)


@triton.jit
def _decode_merge_kernel(
    Mid_O, Mid_LSE, Out, num_splits, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    split_ok = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    row = (b * tl.num_programs(1) + head) * num_splits
    lse = tl.load(Mid_LSE + row + splits, mask=split_ok, other=float("-inf"))  # [BLOCK_S]
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # a sequence with no keys at all: output 0
    w = tl.exp(lse - m)
    total = tl.sum(w, 0)
    o = tl.load(
        Mid_O + (row + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=split_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    out = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        Out + b * stride_ob + head * stride_oh + dims, out.to(Out.dtype.element_ty), mask=dim_ok
    )


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int | None, num_sms: int) -> int:
    """Splits per sequence: enough programs for PROGRAMS_PER_SM on every SM, no split shorter
    than MIN_SPLIT_TOKENS (when max_seq_len is known), at most MAX_SPLITS; a power of two.
    For a sliding-window layer pass the keys it reads, min(max_seq_len, window) (the window
    alone when the length is not known)."""
    want = triton.cdiv(num_sms * PROGRAMS_PER_SM, batch * num_kv_heads)
    if max_seq_len is not None:
        want = min(want, triton.cdiv(max_seq_len, MIN_SPLIT_TOKENS))
    return min(triton.next_power_of_2(max(want, 1)), MAX_SPLITS)


def decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [pool, Hkv, D]
    v_buffer: torch.Tensor,  # [pool, Hkv, D]
    kv_indptr: torch.Tensor,  # [B+1] int64
    kv_indices: torch.Tensor,  # [sum(L)] int64 pool slots
    scaling: float,
    num_splits: int,
    out: torch.Tensor | None = None,  # [B, Hq, D], written if given
    *,
    window: int = 0,  # > 0: only the last `window` keys of each sequence
    block_n: int = BLOCK_N,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
) -> torch.Tensor:  # [B, Hq, D] in q.dtype
    """Attention of each sequence's one query token over all of its keys (see module doc), or
    with window W > 0 over its last min(L, W) keys only; W is a kernel argument, not derived
    from the lengths, so a CUDA graph captured for one length replays for any.
    block_n, num_warps, num_stages: the split kernel's tiling (scripts/bench_kernels.py
    --sweep times the alternatives).

    Allocates only float32 scratch ([B, Hq, S, D] + [B, Hq, S]), from the caching allocator, so
    it may run under CUDA-graph capture. A sequence of length 0 gets output 0."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_heads // num_kv_heads
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1 and k_buffer.stride(2) == 1
    assert window >= 0
    if out is None:
        out = torch.empty_like(q)
    mid_o = torch.empty(
        batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )
    mid_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, mid_o, mid_lse, scaling, num_splits, window,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d, BLOCK_N=block_n, DOT=dot_dtype(q.dtype), PRECISION=dot_precision(q.dtype),
        WINDOWED=window > 0, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    _decode_merge_kernel[(batch, num_heads)](
        mid_o, mid_lse, out, num_splits, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(num_splits),
    )  # fmt: skip
    return out
