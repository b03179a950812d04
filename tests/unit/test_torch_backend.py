"""TorchAttentionBackend against a naive per-token softmax attention."""

from __future__ import annotations

import pytest
import torch

from radixrt.attention.base import create_backend
from radixrt.attention.forward_batch import ForwardBatch
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool

HQ, HKV, D = 6, 2, 16


def build(pool: KVPool, specs: list[tuple[int, int]], gen: torch.Generator):
    """specs: (prefix_len, extend_len) per sequence; sequence i's slots are scattered (reversed
    and offset) to check that the backend follows kv_indices. The prefix K/V are written into
    the pool here. Returns the batch and each sequence's full K, V [L, Hkv, D]."""
    kv_idx, out_loc, full_k, full_v = [], [], [], []
    for i, (prefix, n) in enumerate(specs):
        total = prefix + n
        slots = (torch.arange(total).flip(0) * 3 + 1000 * i + 7).tolist()
        k = torch.randn(total, HKV, D, generator=gen)
        v = torch.randn(total, HKV, D, generator=gen)
        prefix_slots = torch.tensor(slots[:prefix], dtype=torch.int64)
        for layer in range(pool.num_layers):
            pool.set_kv(layer, prefix_slots, k[:prefix], v[:prefix])
        kv_idx += slots
        out_loc += slots[prefix:]
        full_k.append(k)
        full_v.append(v)
    return make_batch(pool, specs, kv_idx, out_loc), full_k, full_v


def make_batch(
    pool: KVPool, specs: list[tuple[int, int]], kv_idx: list[int], out_loc: list[int]
) -> ForwardBatch:
    """specs: (prefix_len, extend_len) per sequence; kv_idx: every sequence's slots in turn."""
    lens = [p + n for p, n in specs]
    qo = [0] + torch.tensor([n for _, n in specs]).cumsum(0).tolist()
    kvp = [0] + torch.tensor(lens).cumsum(0).tolist()

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64)

    return ForwardBatch(
        input_ids=t([0] * qo[-1]), positions=t(sum((list(range(p, p + n)) for p, n in specs), [])),
        out_cache_loc=t(out_loc), qo_indptr=t(qo), kv_indices=t(kv_idx), kv_indptr=t(kvp),
        seq_lens=t(lens), extend_lens=t([n for _, n in specs]), seq_lens_cpu=lens,
        extend_lens_cpu=[n for _, n in specs], prefix_lens_cpu=[p for p, _ in specs],
        kv_pool=pool, attn_backend=TorchAttentionBackend(),
    )  # fmt: skip


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float):
    """q [n, Hq, D] at positions prefix.., k/v [L, Hkv, D] -> [n, Hq, D]."""
    group = HQ // HKV
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [L, Hq, D]
    scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
    q_pos = torch.arange(prefix, prefix + q.shape[0])
    visible = torch.arange(k.shape[0])[None, :] <= q_pos[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hnl,lhd->nhd", probs, v)


@pytest.mark.parametrize(
    "specs",
    [
        [(5, 1), (5, 1), (5, 1)],  # decode only, equal lengths (no mask)
        [(0, 1), (7, 1), (3, 1)],  # decode only, ragged
        [(0, 6)],  # one prefill
        [(4, 3), (0, 5)],  # extend after a prefix, plain prefill
        [(4, 1), (0, 5), (9, 1), (6, 4), (2, 1)],  # everything mixed
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_naive_attention(specs, dtype):
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(4096, 2, HKV, D, dtype, "cpu")
    fb, full_k, full_v = build(pool, specs, gen)
    backend = fb.attn_backend
    backend.init_forward_metadata(fb)
    total = fb.qo_indptr[-1].item()
    q = torch.randn(total, HQ, D, generator=gen)
    k_new = torch.cat([k[p:] for k, (p, _) in zip(full_k, specs, strict=True)])
    v_new = torch.cat([v[p:] for v, (p, _) in zip(full_v, specs, strict=True)])
    scale = D**-0.5
    for layer in range(2):
        out = backend.forward(q.to(dtype), k_new.to(dtype), v_new.to(dtype), layer, fb, scale)
        assert out.shape == (total, HQ, D) and out.dtype == dtype
        start = 0
        for (prefix, n), k, v in zip(specs, full_k, full_v, strict=True):
            k, v = k.to(dtype).float(), v.to(dtype).float()  # as the pool stores them
            want = naive(q[start : start + n], k, v, prefix, scale)
            tol = 1e-5 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(out[start : start + n].float(), want, atol=tol, rtol=0)
            start += n
    # The new tokens' K/V went to their slots.
    torch.testing.assert_close(pool.get_kv(1)[0][fb.out_cache_loc], k_new.to(dtype))


def test_registry_creates_torch_backend():
    assert isinstance(create_backend("torch", page_size=16), TorchAttentionBackend)


def check_against_naive(
    fb: ForwardBatch,
    seqs: list,
    specs: list[tuple[int, int]],
    dtype: torch.dtype,
    gen: torch.Generator,
) -> None:
    """Layer 0's output for random queries equals naive attention over each sequence's K/V."""
    qo = fb.qo_indptr.tolist()
    q = torch.randn(qo[-1], HQ, D, generator=gen)
    k_new = torch.cat([k[p:] for (k, _), (p, _) in zip(seqs, specs, strict=True)])
    v_new = torch.cat([v[p:] for (_, v), (p, _) in zip(seqs, specs, strict=True)])
    out = fb.attn_backend.forward(q.to(dtype), k_new.to(dtype), v_new.to(dtype), 0, fb, D**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for i, ((k, v), (p, n)) in enumerate(zip(seqs, specs, strict=True)):
        want = naive(q[qo[i] : qo[i] + n], k.to(dtype).float(), v.to(dtype).float(), p, D**-0.5)
        torch.testing.assert_close(out[qo[i] : qo[i] + n].float(), want, atol=tol, rtol=0)


@pytest.mark.parametrize("with_extend", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_with_shared_prefix_slots_matches_naive(with_extend, dtype):
    """Decode sequences whose page tables start with the same 20 slots (a cache hit shared by
    the batch) take the split prefix + own-suffix path; the result must not change."""
    from radixrt.attention.torch_backend import MIN_SHARED_PREFIX

    gen = torch.Generator().manual_seed(1)
    shared_len, own_lens = 20, [0, 3, 7, 1]  # own tokens before the new decode token
    assert shared_len >= MIN_SHARED_PREFIX
    pool = KVPool(512, 1, HKV, D, dtype, "cpu")
    shared_k, shared_v = (torch.randn(shared_len, HKV, D, generator=gen) for _ in range(2))
    shared_slots = torch.arange(100, 100 + shared_len)
    pool.set_kv(0, shared_slots, shared_k, shared_v)
    seqs, kv_idx, out_loc, next_slot = [], [], [], 300
    for own in own_lens:
        k, v = (torch.randn(own + 1, HKV, D, generator=gen) for _ in range(2))
        slots = torch.arange(next_slot, next_slot + own + 1)
        next_slot += own + 1
        pool.set_kv(0, slots[:own], k[:own], v[:own])
        kv_idx += shared_slots.tolist() + slots.tolist()
        out_loc.append(int(slots[-1]))
        seqs.append((torch.cat([shared_k, k]), torch.cat([shared_v, v])))
    specs = [(shared_len + own, 1) for own in own_lens]
    if with_extend:  # a prefill with no prefix in the same batch
        k, v = (torch.randn(5, HKV, D, generator=gen) for _ in range(2))
        slots = torch.arange(next_slot, next_slot + 5)
        kv_idx += slots.tolist()
        out_loc += slots.tolist()
        seqs.append((k, v))
        specs.append((0, 5))
    fb = make_batch(pool, specs, kv_idx, out_loc)
    fb.attn_backend.init_forward_metadata(fb)
    assert fb.attn_metadata.decode.prefix_slots is not None, "the split path was not taken"
    check_against_naive(fb, seqs, specs, dtype, gen)


def sequences_after_shared_prefix(pool, shared_len: int, layout, gen):
    """Sequences whose slots start with the same `shared_len` slots, then (own, n) = own cached
    tokens and n new ones each. Returns (seqs, specs, kv_indices, out_cache_loc) for
    make_batch / check_against_naive; the cached K/V are written to the pool."""
    shared_k, shared_v = (torch.randn(shared_len, HKV, D, generator=gen) for _ in range(2))
    shared_slots = torch.arange(600, 600 + shared_len)
    pool.set_kv(0, shared_slots, shared_k, shared_v)
    seqs, specs, kv_idx, out_loc, next_slot = [], [], [], [], 0
    for own, n in layout:
        k, v = (torch.randn(own + n, HKV, D, generator=gen) for _ in range(2))
        slots = torch.arange(next_slot, next_slot + own + n)
        next_slot += own + n + 3  # gaps: the slots are not contiguous across sequences
        pool.set_kv(0, slots[:own], k[:own], v[:own])
        kv_idx += shared_slots.tolist() + slots.tolist()
        out_loc += slots[own:].tolist()
        seqs.append((torch.cat([shared_k, k]), torch.cat([shared_v, v])))
        specs.append((shared_len + own, n))
    return seqs, specs, kv_idx, out_loc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extends_with_shared_prefix_slots_match_naive(dtype):
    """Prefill chunks whose cached prefixes start with the same 24 slots (siblings after a
    radix hit) attend to those slots in one block; results must equal plain attention."""
    gen = torch.Generator().manual_seed(2)
    shared_len = 24
    pool = KVPool(1024, 1, HKV, D, dtype, "cpu")
    # (own cached tokens after the shared part, new tokens); plus a decode and a fresh prefill.
    # The chunks are longer than MAX_BATCHED_EXTEND: short ones join the decode call (below).
    layout = [(0, 20), (5, 17), (2, 30), (7, 1)]
    seqs, specs, kv_idx, out_loc = sequences_after_shared_prefix(pool, shared_len, layout, gen)
    k, v = (torch.randn(4, HKV, D, generator=gen) for _ in range(2))
    kv_idx += list(range(900, 904))
    out_loc += list(range(900, 904))
    seqs.append((k, v))
    specs.append((0, 4))
    fb = make_batch(pool, specs, kv_idx, out_loc)
    fb.attn_backend.init_forward_metadata(fb)
    shared = fb.attn_metadata.shared_extend
    assert shared is not None and shared.prefix_slots.numel() == shared_len
    check_against_naive(fb, seqs, specs, dtype, gen)


@pytest.mark.parametrize("shared_len", [0, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_short_extends_join_the_padded_decode_call(dtype, shared_len):
    """A few new tokens after a cached prefix (a checked jump-forward proposal, a short chunk)
    go through the decode call with decodes, padded, each query seeing keys up to itself;
    with and without a shared prefix. Results must equal plain attention."""
    gen = torch.Generator().manual_seed(3)
    pool = KVPool(1024, 1, HKV, D, dtype, "cpu")
    layout = [(3, 5), (9, 1), (2, 16), (6, 2), (1, 1)]  # (own cached tokens, new tokens)
    seqs, specs, kv_idx, out_loc = sequences_after_shared_prefix(pool, shared_len, layout, gen)
    fb = make_batch(pool, specs, kv_idx, out_loc)
    fb.attn_backend.init_forward_metadata(fb)
    meta = fb.attn_metadata
    assert not meta.extends and meta.shared_extend is None, "every sequence is decode-like"
    assert meta.decode.q_len == 16 and meta.decode.batch == len(layout)
    assert (meta.decode.prefix_slots is not None) == (shared_len > 0)
    check_against_naive(fb, seqs, specs, dtype, gen)
