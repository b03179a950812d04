"""Paged attention in plain torch: correct on any device, and the reference for other backends.

Per forward, `init_forward_metadata` splits the batch into decode-like sequences (one new
token, or a few after a cached prefix: a checked jump-forward proposal, a short chunk) and
extend sequences (a longer prefill chunk after an optional cached prefix) and builds their
index tables once. Per layer, all decode-like sequences go through one padded SDPA call; extend
sequences, few per step, go one by one.

On the CPU, when radixrt's native kernels are built (radixrt/native/build.py), the whole batch goes
through one unpadded paged-attention kernel instead (radixrt/attention/cpu_native.py); the
SDPA path stays as the fallback and as the reference the kernel is tested against.

A sliding-window layer (forward's `window` > 0) reads metadata built for its window the first
time a layer asks in this forward: its masks also hide the keys before each token's band, no
shared prefix is split off (a token past the window does not see it), and the native kernel
gets the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from radixrt.attention.base import AttentionBackend
from radixrt.attention.cascade import (
    attention_with_lse,
    merge,
    shared_extend,
    shared_prefix_attention,
)
from radixrt.attention.cpu_native import (
    NativePlan,
    can_run_native,
    native_attention,
    offsets,
    plan_native,
)
from radixrt.attention.forward_batch import ForwardBatch
from radixrt.native.build import load_native

# Decode sequences whose page tables start with the same slots (a radix-cache hit shared by
# the whole batch) attend to that common prefix once, as one dense block, and to their own
# suffixes separately; the two softmaxes are merged through their log-sum-exp ("cascade"
# attention). Below this many shared tokens the split does not pay.
MIN_SHARED_PREFIX = 16
# Sequences adding at most this many tokens after a cached prefix join the padded decode call
# (one SDPA for all) instead of one SDPA each.
MAX_BATCHED_EXTEND = 16


@dataclass(frozen=True)
class DecodeMetadata:
    """The decode-like sequences of the batch, padded to the longest: Bd sequences of up to Lq
    new tokens each (1 for plain decodes) over up to Lmax slots.

    With a shared prefix of P slots, `slots`/`mask`/`max_len` describe only the suffixes
    (positions P.. of each sequence) and `prefix_slots` the P shared slots."""

    # [Bd * Lq] rows of the batch's tokens, sequence-major; a short sequence's padding rows
    # repeat its last token. None: every row of the batch, in order (a decode-only batch).
    token_idx: torch.Tensor | None
    real: torch.Tensor | None  # [Bd * Lq] bool, the rows that are not padding; None: all
    slots: torch.Tensor  # [Bd * Lmax] pool slots, row-major; padding repeats a real slot
    mask: torch.Tensor | None  # [Bd, 1, Lq, Lmax] additive (0 / -inf); None: all visible
    batch: int
    max_len: int
    q_len: int = 1
    prefix_slots: torch.Tensor | None = None  # [P] slots every sequence starts with


@dataclass(frozen=True)
class ExtendMetadata:
    """One extend sequence: new tokens start:end of the batch after prefix_len cached ones."""

    start: int
    end: int
    prefix_len: int
    slots: torch.Tensor | None  # [prefix_len + n] pool slots; None when there is no prefix
    mask: torch.Tensor | None  # [n, prefix_len + n] additive (0 / -inf); None: plain causal


@dataclass(frozen=True)
class SharedExtendMetadata:
    """Extend sequences whose cached prefixes start with the same `prefix_slots`: all their
    new tokens (`rows` of the batch) attend to those slots in one block; `extends` then hold
    only each sequence's remaining keys (from the shared length on)."""

    rows: torch.Tensor  # [N] int64, the group's new tokens, sequence after sequence
    prefix_slots: torch.Tensor  # [P]
    extends: list[OwnKeysMetadata]


@dataclass(frozen=True)
class OwnKeysMetadata:
    """One sequence of a shared-prefix group: new tokens start:end of the batch, and the keys
    it has after the shared prefix."""

    start: int
    end: int
    slots: torch.Tensor  # [L] pool slots of its keys from the shared length on
    mask: torch.Tensor  # [n, L] additive (0 / -inf)


@dataclass(frozen=True)
class TorchAttentionMetadata:
    decode: DecodeMetadata | None
    extends: list[ExtendMetadata]
    shared_extend: SharedExtendMetadata | None = None
    native: NativePlan | None = None  # set when the native CPU kernel runs this batch
    window: int = 0  # what these masks and plan were built for (0: full causal)
    # The same batch's metadata for each sliding window its layers use, built on first use.
    windowed: dict[int, TorchAttentionMetadata] = field(default_factory=dict)


class TorchAttentionBackend(AttentionBackend):
    """Paged attention with `torch.nn.functional.scaled_dot_product_attention`."""

    def __init__(self, **kwargs: object) -> None:
        # Other backends' constructor options (page size...) are not needed here. The native
        # kernels build (or load from their cache) now, not in the first request's forward.
        on_cpu = str(kwargs.get("device", "cpu")).startswith("cpu")
        self._native = load_native() if on_cpu else None

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Build the decode table and the per-extend-sequence data; sets `fb.attn_metadata`."""
        fb.attn_metadata = self._metadata(fb, 0)

    def _metadata(self, fb: ForwardBatch, window: int) -> TorchAttentionMetadata:
        batched = [
            n == 1 or (n <= MAX_BATCHED_EXTEND and p > 0)
            for n, p in zip(fb.extend_lens_cpu, fb.prefix_lens_cpu, strict=True)
        ]
        decode_ids = [i for i, b in enumerate(batched) if b]
        extend_ids = [i for i, b in enumerate(batched) if not b]
        decode = _decode_metadata(fb, decode_ids, window) if decode_ids else None
        starts, kv_starts = offsets(fb.extend_lens_cpu), offsets(fb.seq_lens_cpu)
        extends = [_extend_metadata(fb, i, starts[i], kv_starts[i], window) for i in extend_ids]
        shared = _shared_extend_metadata(extends) if window == 0 else None
        if shared is not None:
            extends = [e for e in extends if e.prefix_len == 0]
        native = None
        if self._native is not None and fb.kv_indices.device.type == "cpu":
            native = _native_plan(fb, decode_ids, decode, extend_ids, shared, window)
        return TorchAttentionMetadata(decode, extends, shared, native, window)

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        layer_id: int,
        fb: ForwardBatch,
        scaling: float,
        window: int = 0,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Write k/v into the pool (layer `layer_id`), then attend; see AttentionBackend."""
        fb.kv_pool.set_kv(layer_id, fb.out_cache_loc, k, v)
        meta = fb.attn_metadata
        assert isinstance(meta, TorchAttentionMetadata), "init_forward_metadata did not run"
        if window > 0:
            if window not in meta.windowed:
                meta.windowed[window] = self._metadata(fb, window)
            meta = meta.windowed[window]
        k_cache, v_cache = fb.kv_pool.get_kv(layer_id)
        if meta.native is not None and can_run_native(q, k_cache, v_cache):
            return native_attention(self._native, q, k_cache, v_cache, meta.native, scaling)
        dec = meta.decode
        if dec is not None and dec.token_idx is None:
            return _decode(q, k_cache, v_cache, dec, scaling)  # decode-only batch
        out = torch.empty_like(q)
        if dec is not None and dec.token_idx is not None:  # always, when dec is not None
            o = _decode(q.index_select(0, dec.token_idx), k_cache, v_cache, dec, scaling)
            if dec.real is None:
                out[dec.token_idx] = o
            else:
                out[dec.token_idx[dec.real]] = o[dec.real]
        for ext in meta.extends:
            out[ext.start : ext.end] = _extend(q, k, v, k_cache, v_cache, ext, scaling)
        if meta.shared_extend is not None:
            shared_extend(q, k_cache, v_cache, meta.shared_extend, scaling, out)
        return out


def _native_plan(
    fb: ForwardBatch,
    decode_ids: list[int],
    decode: DecodeMetadata | None,
    extend_ids: list[int],
    shared: SharedExtendMetadata | None,
    window: int,
) -> NativePlan:
    """The same cascades as the torch path (a prefix shared by the decode-like sequences, one
    shared by the extends with a cached prefix); every other key goes to the kernel."""
    cascades = []
    if decode is not None and decode.prefix_slots is not None:
        cascades.append((decode_ids, decode.prefix_slots))
    if shared is not None:
        cascades.append(([i for i in extend_ids if fb.prefix_lens_cpu[i] > 0], shared.prefix_slots))
    return plan_native(fb, cascades, window)


def _decode_metadata(fb: ForwardBatch, ids: list[int], window: int) -> DecodeMetadata:
    device = fb.kv_indices.device
    lens_cpu = [fb.seq_lens_cpu[i] for i in ids]
    max_len = max(lens_cpu)
    q_len = max(fb.extend_lens_cpu[i] for i in ids)
    ids_t = torch.tensor(ids, dtype=torch.int64, device=device)
    starts = fb.kv_indptr.index_select(0, ids_t)  # [Bd]
    lens = fb.seq_lens.index_select(0, ids_t)  # [Bd]
    cols = torch.arange(max_len, device=device)  # [Lmax]
    valid = cols[None, :] < lens[:, None]  # [Bd, Lmax]
    # Padding points at the sequence's first slot: real, finite data that the mask then hides.
    offsets = torch.where(valid, starts[:, None] + cols[None, :], starts[:, None])
    table = fb.kv_indices.index_select(0, offsets.reshape(-1)).view(len(ids), max_len)
    # Query t of a sequence with n new tokens sits at position len - n + t and sees the keys
    # up to it; padding queries (t >= n) repeat the last one.
    n_new = fb.extend_lens.index_select(0, ids_t)  # [Bd]
    t = torch.minimum(torch.arange(q_len, device=device)[None, :], n_new[:, None] - 1)
    q_pos = (lens - n_new)[:, None, None] + t[:, :, None]  # [Bd, Lq, 1]
    visible = cols[None, None, :] <= q_pos
    if window > 0:
        visible &= cols[None, None, :] > q_pos - window
    token_idx = real = None
    if q_len > 1 or len(ids) < fb.batch_size:
        token_idx = (fb.qo_indptr.index_select(0, ids_t)[:, None] + t).reshape(-1)
        if q_len > 1:
            real = (torch.arange(q_len, device=device)[None, :] < n_new[:, None]).reshape(-1)
    min_prefix = min(n - fb.extend_lens_cpu[i] for n, i in zip(lens_cpu, ids, strict=True))
    shared = _shared_prefix_len(table, min_prefix + 1) if window == 0 else 0
    prefix_slots = None
    if shared >= MIN_SHARED_PREFIX:
        prefix_slots, table, visible = table[0, :shared], table[:, shared:], visible[..., shared:]
        max_len -= shared
    mask = None if bool(visible.all()) else _additive(visible, fb.kv_pool.dtype)[:, None]
    return DecodeMetadata(
        token_idx, real, table.reshape(-1), mask, len(ids), max_len, q_len, prefix_slots
    )


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = attend) as the additive 0 / -inf mask that SDPA and the CPU flash
    kernel both take, built once per forward rather than in every layer."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
        ~visible, float("-inf")
    )


def _shared_prefix_len(table: torch.Tensor, min_len: int) -> int:
    """Leading columns on which every row of the [Bd, Lmax] slot table agrees, keeping at
    least one own slot per sequence."""
    if table.shape[0] < 2:
        return 0
    same = (table[:, :min_len] == table[:1, :min_len]).all(dim=0)  # [min_len]
    differ = (~same).nonzero()
    shared = int(differ[0]) if differ.numel() else min_len
    return min(shared, min_len - 1)


def _extend_metadata(
    fb: ForwardBatch, i: int, start: int, kv_start: int, window: int
) -> ExtendMetadata:
    # start / kv_start: offsets of sequence i in the batch's tokens / in kv_indices, from the
    # Python length lists (reading qo_indptr or kv_indptr would sync with the device).
    end = start + fb.extend_lens_cpu[i]
    prefix = fb.prefix_lens_cpu[i]
    total = prefix + (end - start)
    windowed = 0 < window < total
    if prefix == 0 and not windowed:
        return ExtendMetadata(start, end, 0, None, None)
    slots = fb.kv_indices[kv_start : kv_start + total] if prefix else None
    device = fb.kv_indices.device
    # A query at position p sees keys at positions <= p: bottom-right aligned causal mask
    # (and, in a sliding window, only those after p - window).
    q_pos = torch.arange(prefix, total, device=device)[:, None]
    keys = torch.arange(total, device=device)[None, :]
    visible = keys <= q_pos  # [n, total]
    if windowed:
        visible &= keys > q_pos - window
    return ExtendMetadata(start, end, prefix, slots, _additive(visible, fb.kv_pool.dtype))


def _shared_extend_metadata(extends: list[ExtendMetadata]) -> SharedExtendMetadata | None:
    """Group the extend sequences with a cached prefix if their slots share a long start."""
    # (sequence, its slots, its mask): slots and mask are set when prefix_len > 0.
    group = [(e, e.slots, e.mask) for e in extends if e.slots is not None and e.mask is not None]
    if len(group) < 2:
        return None
    min_prefix = min(e.prefix_len for e, _, _ in group)
    table = torch.stack([slots[:min_prefix] for _, slots, _ in group])  # [G, min_prefix]
    shared = _shared_prefix_len(table, min_prefix + 1)  # all of the shortest prefix may go
    if shared < MIN_SHARED_PREFIX:
        return None
    rows = torch.cat([torch.arange(e.start, e.end, device=table.device) for e, _, _ in group])
    own = [
        OwnKeysMetadata(e.start, e.end, slots[shared:], mask[:, shared:])
        for e, slots, mask in group
    ]
    return SharedExtendMetadata(rows, table[0, :shared], own)


def _decode(
    q: torch.Tensor,  # [Bd * Lq, Hq, D], sequence-major
    k_cache: torch.Tensor,  # [pool, Hkv, D]
    v_cache: torch.Tensor,
    dec: DecodeMetadata,
    scaling: float,
) -> torch.Tensor:  # [Bd * Lq, Hq, D]
    bd, lq = dec.batch, dec.q_len
    hq, d = q.shape[1:]
    hkv = k_cache.shape[1]
    g = hq // hkv
    # index_select is many times faster than advanced indexing for this gather on the CPU.
    k = k_cache.index_select(0, dec.slots).view(bd, dec.max_len, hkv, d).transpose(1, 2)
    v = v_cache.index_select(0, dec.slots).view(bd, dec.max_len, hkv, d).transpose(1, 2)
    # GQA without repeating K/V: query head j uses kv head j // G, so the G heads of each new
    # token become rows (token t, head j) -> t * G + j against one kv head: [Bd, Hkv, Lq*G, D].
    qg = q.view(bd, lq, hkv, g, d).transpose(1, 2).reshape(bd, hkv, lq * g, d)
    mask = dec.mask
    if mask is not None and lq > 1:
        mask = mask.repeat_interleave(g, dim=2)  # [Bd, 1, Lq*G, Lmax]
    k, v = k.to(q.dtype), v.to(q.dtype)
    if dec.prefix_slots is None:
        o = F.scaled_dot_product_attention(qg, k, v, mask, scale=scaling)
    else:
        o_own, lse_own = attention_with_lse(qg, k, v, mask, scaling)
        o_pre, lse_pre = shared_prefix_attention(qg, k_cache, v_cache, dec.prefix_slots, scaling)
        o = merge(o_pre, lse_pre, o_own, lse_own).to(q.dtype)
    return o.view(bd, hkv, lq, g, d).transpose(1, 2).reshape(bd * lq, hq, d)


def _extend(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [pool, Hkv, D]
    v_cache: torch.Tensor,
    ext: ExtendMetadata,
    scaling: float,
) -> torch.Tensor:  # [n, Hq, D]
    qs = q[ext.start : ext.end].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
    if ext.slots is None:
        # No prefix: the keys are exactly the new tokens (read back the pool only if the pool
        # stores another dtype, so that every path sees the same rounded values).
        ks, vs = k[ext.start : ext.end], v[ext.start : ext.end]
        if k_cache.dtype != q.dtype:
            ks, vs = ks.to(k_cache.dtype), vs.to(v_cache.dtype)
    else:
        ks, vs = k_cache.index_select(0, ext.slots), v_cache.index_select(0, ext.slots)
    ks = ks.to(q.dtype).transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
    vs = vs.to(q.dtype).transpose(0, 1).unsqueeze(0)
    o = F.scaled_dot_product_attention(
        qs, ks, vs, ext.mask, is_causal=ext.mask is None, scale=scaling, enable_gqa=True
    )
    return o[0].transpose(0, 1)  # [n, Hq, D]
