"""Batch-invariant paged attention: the Triton kernels behind --enable-deterministic-inference.

The default kernels (decode_attention.py, extend_attention.py) cut the work by the batch: the
decode splits come from the batch size and the SM count, and the extend kernel's key blocks
start where a chunk's prefix ends. Either changes the order of a row's float sums, so a row's
bits depend on what else shares its step, or on where its prefill chunk began. Here a row's
arithmetic depends on its own sequence only (SGLang's Triton backend does the same with a
fixed split tile of 256 keys; radixrt's CPU kernels cut keys at the same positions):

- a row's keys are cut into chunks of `chunk` keys (256) at fixed positions of its sequence
  (0-255, 256-511, ...); within a chunk the online softmax takes blocks of BLOCK_N keys from
  the chunk's start; each chunk gives a normalized partial and its log-sum-exp;
- the partials fold left to right (`_fold`);
- a block or chunk that holds no key a row sees leaves that row's state unchanged, bit for bit
  (explicit `where`s, not exp(0) == 1), so a program may start and stop its loops anywhere
  outside a row's keys: loop bounds follow the program's tile, the arithmetic does not;
- the tiling is fixed per device and GQA group (`_tiling`), never chosen by the batch.

A program's tile is BLOCK_M rows of one sequence and one KV head: TOKENS = BLOCK_M // G new
tokens times the G query heads that share the KV head (row i: token i // G, head i % G), so
K/V are read once per group. The extend kernel, grid (token tiles, B, Hkv), folds all of its
chunks in registers. The decode pair, grid (B, Hkv, S) then (B, Hkv), computes one chunk per
program (flash-decoding's parallelism over long keys) and folds the stored partials in the
same order with the same helpers, so a decode step's row equals the same row in a mixed
extend batch bit for bit. Every kernel is compiled without FMA contraction, so both kernels
round each product and sum alike.

Tested under Triton's CPU interpreter only (tests/kernels/test_invariant_attention.py), where
tl.dot gives way to an explicit sum (`_rows_dot`: numpy's matmul is not row-invariant). So the
tests hold the chunking, block positions, masks and folds; that a tensor core's MMA sums a
row alike wherever it sits in the tile is assumed (batch-invariant GPU kernels rest on it).
Not yet run or timed on a GPU.

Plain-torch reference: `kernels.reference.paged_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixrt.kernels.common import dot_dtype, dot_precision, interpreting

# Keys per chunk, at fixed positions of each sequence: SGLang's default split tile, and the
# CPU kernels' chunk (docs/determinism.md). Tests pass smaller ones to cover many chunks.
KEY_CHUNK = 256


@triton.jit
def _tile_queries(Q, q_start, n_new, first_token, kv_head, stride_qt, stride_qh, dims, dim_ok,
                  GROUP: tl.constexpr, TOKENS: tl.constexpr, BLOCK_M: tl.constexpr,
                  DOT: tl.constexpr):  # fmt: skip
    """The tile's rows: TOKENS tokens from first_token, times the group's GROUP heads."""
    rows = tl.arange(0, BLOCK_M)
    token = first_token + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < TOKENS * GROUP) & (token < n_new)
    offsets = (q_start + token)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(Q + offsets, mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
    return q, offsets, row_ok, token


@triton.jit
def _rows_dot(a, b, PRECISION: tl.constexpr, SUMMED: tl.constexpr):
    """a [M, K] @ b [K, N], each row's sums independent of the other rows. A tensor-core MMA
    computes each output element on its own, in an order its instruction fixes; the
    interpreter's tl.dot, numpy's matmul (OpenBLAS), does not: its result for a row changes
    with the row's index in the tile (rows 0-5 and 6-15 of 16 differ). SUMMED (interpreter
    only) sums the float32 products over K one k after another instead."""
    if SUMMED:
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], 1)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _chunk_partial(q, q_pos, K, V, KV_indices, kv_start, kv_head, dims, dim_ok,
                   chunk_lo, chunk_hi, key_lo, window, scaling,
                   stride_kt, stride_kh, stride_vt, stride_vh,
                   WINDOWED: tl.constexpr, IN: tl.constexpr, DOT: tl.constexpr,
                   PRECISION: tl.constexpr, SUMMED: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """Softmax of the rows at q_pos [BLOCK_M] over the chunk's keys chunk_lo..chunk_hi-1, in
    blocks of BLOCK_N from chunk_lo. Keys before key_lo (no row's window reaches them) are not
    read. Returns the normalized partial [BLOCK_M, BLOCK_D] and its log-sum-exp (-inf: no key)."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # The first block that holds a key at or past key_lo, counted from the chunk's start.
    first = chunk_lo + tl.maximum(key_lo - chunk_lo, 0) // BLOCK_N * BLOCK_N
    for start in range(first, chunk_hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        read = (pos < chunk_hi) & (pos >= key_lo)
        slot = tl.load(KV_indices + kv_start + pos, mask=read, other=0).to(tl.int64)
        kv_offsets = slot[:, None] * stride_kt + kv_head * stride_kh + dims[None, :]
        kv_mask = read[:, None] & dim_ok[None, :]
        k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        s = _rows_dot(q, tl.trans(k.to(IN).to(DOT)), PRECISION, SUMMED) * scaling
        visible = read[None, :] & (pos[None, :] <= q_pos[:, None])  # [BLOCK_M, BLOCK_N]
        if WINDOWED:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        # A block with no key this row sees must leave its sums exactly as they were.
        alpha = tl.where(m_new == m, 1.0, tl.exp(m - m_safe))
        v = tl.load(
            V + slot[:, None] * stride_vt + kv_head * stride_vh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )
        # p is rounded to the activations' dtype for the tensor cores, as the other kernels do.
        acc = acc * alpha[:, None] + _rows_dot(
            p.to(IN).to(DOT), v.to(IN).to(DOT), PRECISION, SUMMED
        )
        denom = denom * alpha + tl.sum(p, 1)
        m = m_new
    empty = denom == 0.0
    o = acc / tl.where(empty, 1.0, denom)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, denom)))
    return o, lse


@triton.jit
def _fold(o, lse, o_c, lse_c):
    """The running (o, lse) [BLOCK_M, BLOCK_D], [BLOCK_M] with the next chunk's partial. An
    empty partial (lse_c -inf) keeps the state bit for bit; an empty state takes the partial."""
    m = tl.maximum(lse, lse_c)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m_safe)
    w_c = tl.exp(lse_c - m_safe)
    keep = lse_c == float("-inf")
    take = lse == float("-inf")
    # Both empty: total 0, and the result is the state anyway (no 0 / 0 computed).
    total = tl.where(keep & take, 1.0, w + w_c)
    both = (o * w[:, None] + o_c * w_c[:, None]) / total[:, None]
    o = tl.where(keep[:, None], o, tl.where(take[:, None], o_c, both))
    lse = tl.where(keep, lse, tl.where(take, lse_c, m_safe + tl.log(total)))
    return o, lse


@triton.jit
def _visible_keys(first_pos, last_pos, window, WINDOWED: tl.constexpr):
    """Keys key_lo..hi-1 hold every key seen by queries at positions first_pos..last_pos."""
    key_lo = 0
    if WINDOWED:
        key_lo = tl.maximum(first_pos - window + 1, 0)
    return key_lo, last_pos + 1


@triton.jit
def _extend_kernel(
    Q, K, V, Out, QO_indptr, KV_indptr, KV_indices, scaling, window,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    GROUP: tl.constexpr, TOKENS: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT: tl.constexpr, PRECISION: tl.constexpr, SUMMED: tl.constexpr, WINDOWED: tl.constexpr,
):  # fmt: skip
    IN = Q.dtype.element_ty
    tile = tl.program_id(0)
    b = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(QO_indptr + b)
    n_new = tl.load(QO_indptr + b + 1) - q_start
    kv_start = tl.load(KV_indptr + b)
    prefix = tl.load(KV_indptr + b + 1) - kv_start - n_new
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q, offsets, row_ok, token = _tile_queries(
        Q, q_start, n_new, tile * TOKENS, kv_head, stride_qt, stride_qh, dims, dim_ok,
        GROUP, TOKENS, BLOCK_M, DOT,
    )  # fmt: skip
    last = tl.minimum(tile * TOKENS + TOKENS, n_new) - 1
    key_lo, hi = _visible_keys(prefix + tile * TOKENS, prefix + last, window, WINDOWED)
    # A tile past the end of a shorter sequence has no rows: it reads nothing.
    active = tile * TOKENS < n_new
    key_lo = tl.where(active, key_lo, 0)
    hi = tl.where(active, hi, 0)
    o = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lse = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for chunk_lo in range(key_lo // CHUNK * CHUNK, hi, CHUNK):
        o_c, lse_c = _chunk_partial(
            q, prefix + token, K, V, KV_indices, kv_start, kv_head, dims, dim_ok,
            chunk_lo, tl.minimum(chunk_lo + CHUNK, hi), key_lo, window, scaling,
            stride_kt, stride_kh, stride_vt, stride_vh,
            WINDOWED, IN, DOT, PRECISION, SUMMED, BLOCK_M, BLOCK_N, BLOCK_D,
        )  # fmt: skip
        o, lse = _fold(o, lse, o_c, lse_c)
    tl.store(Out + offsets, o.to(IN), mask=row_ok[:, None] & dim_ok[None, :])


@triton.jit
def _partial_rows(b, kv_head, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, num_chunks):
    """Where the tile's rows' first partials lie in Mid_LSE ([B, Hq, num_chunks])."""
    heads = kv_head * GROUP + tl.arange(0, BLOCK_M)
    return (b * GROUP * tl.num_programs(1) + heads) * num_chunks


@triton.jit
def _decode_chunk_kernel(
    Q, K, V, KV_indptr, KV_indices, Mid_O, Mid_LSE, scaling, window, num_chunks,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT: tl.constexpr, PRECISION: tl.constexpr, SUMMED: tl.constexpr, WINDOWED: tl.constexpr,
):  # fmt: skip
    """Program (b, kv_head, j): the j-th chunk that sequence b's query sees (past its last, an
    empty partial). Writes Mid_O [B, Hq, num_chunks, D] and Mid_LSE [B, Hq, num_chunks]."""
    IN = Q.dtype.element_ty
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    j = tl.program_id(2)
    kv_start = tl.load(KV_indptr + b)
    seq_len = tl.load(KV_indptr + b + 1) - kv_start
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    # The extend kernel's tile with one token: the group's heads, the other rows padding.
    q, _, row_ok, token = _tile_queries(
        Q, b, 1, 0, kv_head, stride_qb, stride_qh, dims, dim_ok, GROUP, 1, BLOCK_M, DOT
    )
    key_lo, hi = _visible_keys(seq_len - 1, seq_len - 1, window, WINDOWED)
    chunk_lo = (key_lo // CHUNK + j) * CHUNK
    o, lse = _chunk_partial(
        q, seq_len - 1 + token, K, V, KV_indices, kv_start, kv_head, dims, dim_ok,
        chunk_lo, tl.minimum(chunk_lo + CHUNK, hi), key_lo, window, scaling,
        stride_kt, stride_kh, stride_vt, stride_vh,
        WINDOWED, IN, DOT, PRECISION, SUMMED, BLOCK_M, BLOCK_N, BLOCK_D,
    )  # fmt: skip
    mid = _partial_rows(b, kv_head, GROUP, BLOCK_M, num_chunks) + j
    mask = row_ok[:, None] & dim_ok[None, :]
    tl.store(Mid_O + mid[:, None] * HEAD_DIM + dims[None, :], o, mask=mask)
    tl.store(Mid_LSE + mid, lse, mask=row_ok)


@triton.jit
def _decode_fold_kernel(
    Mid_O, Mid_LSE, Out, KV_indptr, window, num_chunks, stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, WINDOWED: tl.constexpr,
):  # fmt: skip
    """Program (b, kv_head): folds its rows' partials left to right, as the extend kernel does
    in registers. A sequence of length 0 (CUDA-graph padding) gets output 0."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(KV_indptr + b + 1) - tl.load(KV_indptr + b)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    mid = _partial_rows(b, kv_head, GROUP, BLOCK_M, num_chunks)
    key_lo, hi = _visible_keys(seq_len - 1, seq_len - 1, window, WINDOWED)
    count = tl.minimum(tl.cdiv(hi, CHUNK) - key_lo // CHUNK, num_chunks)  # 0 when empty
    o = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lse = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for j in range(0, count):
        o_c = tl.load(Mid_O + (mid + j)[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
        lse_c = tl.load(Mid_LSE + mid + j, mask=row_ok, other=float("-inf"))
        o, lse = _fold(o, lse, o_c, lse_c)
    out = Out + b * stride_ob + (kv_head * GROUP + rows)[:, None] * stride_oh + dims[None, :]
    tl.store(out, o.to(Out.dtype.element_ty), mask=mask)


def _tiling(group: int, device: torch.device) -> dict[str, int]:
    """One tiling per device and GQA group for decode and extend alike (a row's sums follow
    the tile's shape), never chosen by the batch."""
    block_m = triton.next_power_of_2(group)
    if interpreting() or device.type != "cuda":
        # The interpreter runs each block operation in numpy: small blocks are quickest.
        return dict(BLOCK_M=max(16, block_m), BLOCK_N=32, num_warps=4, num_stages=1)
    # The default extend kernel's tiling (docs/gpu_h200.md); not timed for these kernels.
    return dict(BLOCK_M=max(64, block_m), BLOCK_N=64, num_warps=4, num_stages=2)


def chunks_seen(max_seq_len: int, window: int, chunk: int = KEY_CHUNK) -> int:
    """How many chunks a decode query of a sequence of up to max_seq_len keys sees: all of
    them, or with a window W > 0 those its last W keys touch."""
    full = triton.cdiv(max_seq_len, chunk)
    return min(full, (window - 1) // chunk + 2) if window > 0 else full


def _launch_common(q: torch.Tensor, k_buffer: torch.Tensor, chunk: int) -> dict[str, object]:
    """The constexprs and launch settings both kernels share."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buffer.shape[1]
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1 and k_buffer.stride(2) == 1
    tiling = _tiling(num_heads // num_kv_heads, q.device)
    assert chunk % tiling["BLOCK_N"] == 0, "a chunk must hold whole key blocks"
    return dict(
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, CHUNK=chunk,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), DOT=dot_dtype(q.dtype),
        PRECISION=dot_precision(q.dtype), SUMMED=interpreting(), enable_fp_fusion=False,
        **tiling,
    )  # fmt: skip


def extend_attention_invariant(
    q: torch.Tensor,  # [T, Hq, D] the new tokens of every sequence, sequence after sequence
    k_buffer: torch.Tensor,  # [pool, Hkv, D], new tokens' K already stored
    v_buffer: torch.Tensor,  # [pool, Hkv, D]
    qo_indptr: torch.Tensor,  # [B+1] int64
    kv_indptr: torch.Tensor,  # [B+1] int64
    kv_indices: torch.Tensor,  # [sum(L)] int64 pool slots, position order per sequence
    max_new_tokens: int,  # max over sequences of n_b (a Python int: sets the grid)
    scaling: float,
    out: torch.Tensor | None = None,  # [T, Hq, D], written if given
    *,
    window: int = 0,  # > 0: each token sees only the last `window` positions up to its own
    chunk: int = KEY_CHUNK,
) -> torch.Tensor:  # [T, Hq, D] in q.dtype
    """extend_attention's contract, with each row's result independent of the batch, of where
    its sequence's new tokens begin and of its place in a tile (see the module doc)."""
    assert window >= 0
    if out is None:
        out = torch.empty_like(q)
    batch = qo_indptr.numel() - 1
    if q.shape[0] == 0 or batch == 0:
        return out
    common = _launch_common(q, k_buffer, chunk)
    tokens = int(common["BLOCK_M"]) // int(common["GROUP"])
    grid = (triton.cdiv(max_new_tokens, tokens), batch, k_buffer.shape[1])
    _extend_kernel[grid](
        q, k_buffer, v_buffer, out, qo_indptr, kv_indptr, kv_indices, scaling, window,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        TOKENS=tokens, WINDOWED=window > 0, **common,
    )  # fmt: skip
    return out


def decode_attention_invariant(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [pool, Hkv, D]
    v_buffer: torch.Tensor,  # [pool, Hkv, D]
    kv_indptr: torch.Tensor,  # [B+1] int64
    kv_indices: torch.Tensor,  # [sum(L)] int64 pool slots
    scaling: float,
    max_seq_len: int | None,
    out: torch.Tensor | None = None,  # [B, Hq, D], written if given
    *,
    window: int = 0,  # > 0: only the last `window` keys of each sequence
    chunk: int = KEY_CHUNK,
) -> torch.Tensor:  # [B, Hq, D] in q.dtype
    """decode_attention's contract, each row's result independent of the batch and equal to
    the same row in extend_attention_invariant. max_seq_len bounds every sequence's length (the
    batch's longest; under CUDA graphs the context length): it sets how many chunk programs
    run, never a row's sums. None (no bound known): one program per sequence and KV head folds
    every chunk, the extend kernel's way: the same bits, less parallel over long sequences.
    Allocates float32 scratch only ([B, Hq, S, D] + [B, Hq, S]), so it may run under capture."""
    assert window >= 0
    batch, num_heads, head_dim = q.shape
    if out is None:
        out = torch.empty_like(q)
    if max_seq_len is None:
        qo_indptr = torch.arange(batch + 1, dtype=torch.int64, device=q.device)
        return extend_attention_invariant(
            q, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, 1, scaling, out,
            window=window, chunk=chunk,
        )  # fmt: skip
    if batch == 0:
        return out
    num_chunks = max(1, chunks_seen(max_seq_len, window, chunk))
    scratch = dict(dtype=torch.float32, device=q.device)
    mid_o = torch.empty(batch, num_heads, num_chunks, head_dim, **scratch)
    mid_lse = torch.empty(batch, num_heads, num_chunks, **scratch)
    common = _launch_common(q, k_buffer, chunk)
    num_kv_heads = k_buffer.shape[1]
    _decode_chunk_kernel[(batch, num_kv_heads, num_chunks)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, mid_o, mid_lse, scaling, window,
        num_chunks, q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), WINDOWED=window > 0, **common,
    )  # fmt: skip
    fold = {k: common[k] for k in ("GROUP", "HEAD_DIM", "CHUNK", "BLOCK_M", "BLOCK_D")}
    _decode_fold_kernel[(batch, num_kv_heads)](
        mid_o, mid_lse, out, kv_indptr, window, num_chunks, out.stride(0), out.stride(1),
        WINDOWED=window > 0, enable_fp_fusion=False, **fold,
    )  # fmt: skip
    return out
