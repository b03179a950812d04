"""Extend (prefill) attention: new tokens over their own cached prefix in the paged KV pool.

Sequence b has n_b new tokens (rows qo_indptr[b]:qo_indptr[b+1] of q) at its last n_b positions,
and L_b keys in the pool at slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] (the cached prefix of
P_b = L_b - n_b tokens, then the new tokens, whose K/V the caller has already stored). A new
token at position p attends to every key at a position <= p: fully to the prefix, causally to
the new tokens; with a sliding window W > 0, only to those at positions > p - W (transformers'
sliding-window mask). The prefix is read from the pool, never recomputed: a radix-cache hit
costs only its reads.

Grid (ceil(max n_b / BLOCK_M), B, Hq): a program takes BLOCK_M new tokens of one sequence for
one query head, runs an online softmax (float32) over the prefix without a mask, then over the
new tokens up to its last row with the causal mask. A window (the constexpr WINDOWED, so W = 0
compiles to the kernel without it) adds the band's lower edge to both masks and starts the
program's key loop at the first key its first row sees: a prefix that lies before the window
is not read. A decode step is the case n_b = 1, so a batch that mixes prefill chunks and decode
steps runs through this kernel in one launch.

Plain-torch reference: `kernels.reference.paged_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixrt.kernels.common import dot_dtype, dot_precision, interpreting


@triton.jit
def _attend(q, K, V, slot, kv_head, dims, key_mask, visible, m, denom, acc, scaling,
            stride_kt, stride_kh, stride_vt, stride_vh,
            IN: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """One block of keys into the running softmax. visible [BLOCK_M, BLOCK_N]; a row with no
    visible key so far keeps m = -inf and contributes nothing (no NaN)."""
    k = tl.load(
        K + slot[:, None] * stride_kt + kv_head * stride_kh + dims[None, :],
        mask=key_mask,
        other=0.0,
    )  # [BLOCK_N, BLOCK_D]
    s = tl.dot(q, tl.trans(k.to(IN).to(DOT)), input_precision=PRECISION) * scaling
    s = tl.where(visible, s, float("-inf"))  # [BLOCK_M, BLOCK_N]
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m - m_safe)
    v = tl.load(
        V + slot[:, None] * stride_vt + kv_head * stride_vh + dims[None, :],
        mask=key_mask,
        other=0.0,
    )
    acc = acc * alpha[:, None] + tl.dot(
        p.to(IN).to(DOT), v.to(IN).to(DOT), input_precision=PRECISION
    )
    return m_new, denom * alpha + tl.sum(p, 1), acc


@triton.jit
def _attend_keys(q, q_pos, K, V, KV_indices, kv_start, kv_head, dims, dim_ok, lo, hi, window,
                 m, denom, acc, scaling, stride_kt, stride_kh, stride_vt, stride_vh,
                 CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                 IN: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_N: tl.constexpr):  # fmt: skip
    """Keys at positions lo..hi-1 into the running softmax of the queries at q_pos [BLOCK_M]:
    causally if CAUSAL (the new tokens; the prefix precedes every query), and only the last
    `window` positions up to each query if WINDOWED."""
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        ok = pos < hi
        slot = tl.load(KV_indices + kv_start + pos, mask=ok, other=0).to(tl.int64)
        visible = ok[None, :]  # [1, BLOCK_N], broadcast over the rows
        if CAUSAL:
            visible = visible & (pos[None, :] <= q_pos[:, None])
        if WINDOWED:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        m, denom, acc = _attend(
            q, K, V, slot, kv_head, dims, ok[:, None] & dim_ok[None, :], visible, m, denom, acc,
            scaling, stride_kt, stride_kh, stride_vt, stride_vh, IN, DOT, PRECISION,
        )  # fmt: skip
    return m, denom, acc


@triton.jit
def _extend_kernel(
    Q, K, V, Out, QO_indptr, KV_indptr, KV_indices, scaling, window,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr, WINDOWED: tl.constexpr,
):  # fmt: skip
    IN = Q.dtype.element_ty
    m_block = tl.program_id(0)
    b = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // GROUP
    q_start = tl.load(QO_indptr + b)
    n_new = tl.load(QO_indptr + b + 1) - q_start
    kv_start = tl.load(KV_indptr + b)
    seq_len = tl.load(KV_indptr + b + 1) - kv_start
    prefix = seq_len - n_new
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_new
    q_pos = prefix + rows  # [BLOCK_M] positions of the queries in their sequence
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        Q + (q_start + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    ).to(DOT)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Programs past the end of a shorter sequence have no rows: they read nothing.
    active = m_block * BLOCK_M < n_new
    prefix_end = tl.where(active, prefix, 0)
    # The new tokens, causally, up to this block's last query.
    hi = tl.where(active, tl.minimum(seq_len, prefix + (m_block + 1) * BLOCK_M), 0)
    prefix_lo = 0
    new_lo = prefix_end
    if WINDOWED:
        # The block's first query sees nothing before key_lo, its later ones even less: the keys
        # before it (most of a long prefix) are not read at all.
        key_lo = tl.maximum(prefix + m_block * BLOCK_M - window + 1, 0)
        prefix_lo = tl.minimum(key_lo, prefix_end)
        new_lo = tl.maximum(key_lo, prefix_end)
    m, denom, acc = _attend_keys(
        q, q_pos, K, V, KV_indices, kv_start, kv_head, dims, dim_ok, prefix_lo, prefix_end,
        window, m, denom, acc, scaling, stride_kt, stride_kh, stride_vt, stride_vh,
        False, WINDOWED, IN, DOT, PRECISION, BLOCK_N,
    )  # fmt: skip
    m, denom, acc = _attend_keys(
        q, q_pos, K, V, KV_indices, kv_start, kv_head, dims, dim_ok, new_lo, hi,
        window, m, denom, acc, scaling, stride_kt, stride_kh, stride_vt, stride_vh,
        True, WINDOWED, IN, DOT, PRECISION, BLOCK_N,
    )  # fmt: skip

    out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
    tl.store(
        Out + (q_start + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :],
        out.to(IN),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


def _launch_config(head_dim: int, device: torch.device) -> dict[str, int]:
    if interpreting() or device.type != "cuda":
        # The interpreter runs each block operation in numpy: few, small blocks are quickest.
        return dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)
    if head_dim <= 128:
        # The fastest of seven tilings on an H200 (bench_kernels.py --sweep, docs/gpu_h200.md):
        # 180 TFLOP/s on the ragged benchmark batch against 150 for 128 x 64, 8 warps, 2 stages.
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)


def extend_attention(
    q: torch.Tensor,  # [T, Hq, D] the new tokens of every sequence, sequence after sequence
    k_buffer: torch.Tensor,  # [pool, Hkv, D], new tokens' K already stored
    v_buffer: torch.Tensor,  # [pool, Hkv, D]
    qo_indptr: torch.Tensor,  # [B+1] int64
    kv_indptr: torch.Tensor,  # [B+1] int64
    kv_indices: torch.Tensor,  # [sum(L)] int64 pool slots, position order per sequence
    max_new_tokens: int,  # max over sequences of n_b (a Python int: sets the grid)
    scaling: float,
    out: torch.Tensor | None = None,  # [T, Hq, D], written if given
    config: dict[str, int] | None = None,  # BLOCK_M, BLOCK_N, num_warps, num_stages
    window: int = 0,  # > 0: each token sees only the last `window` positions up to its own
) -> torch.Tensor:  # [T, Hq, D] in q.dtype
    """Causal attention of every new token over its sequence's prefix and new tokens; with
    window W > 0 a token at position p sees the keys at p - W + 1 .. p only, and keys before
    every query's window are not read. `config` replaces the tiling chosen for the device
    (scripts/bench_kernels.py --sweep times them)."""
    assert window >= 0
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1 and k_buffer.stride(2) == 1
    if out is None:
        out = torch.empty_like(q)
    batch = qo_indptr.numel() - 1
    if num_tokens == 0 or batch == 0:
        return out
    cfg = config or _launch_config(head_dim, q.device)
    grid = (triton.cdiv(max_new_tokens, cfg["BLOCK_M"]), batch, num_heads)
    _extend_kernel[grid](
        q, k_buffer, v_buffer, out, qo_indptr, kv_indptr, kv_indices, scaling, window,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT=dot_dtype(q.dtype), PRECISION=dot_precision(q.dtype), WINDOWED=window > 0, **cfg,
    )  # fmt: skip
    return out
