"""radixrt::paged_attention gives a row the same bits whatever else it runs with.

A token's attention must not depend on its batch, on whether it ran in a prefill chunk (the
general tile) or a decode step (the decode tile), on where its chunk or cache hit began, on
the thread count, or on a shared prefix's cascade (attention_chunks.h). Each check compares a
row computed one way with the same row computed alone, with torch.equal: no tolerance.
"""

from __future__ import annotations

import pytest
import torch

from radixrt.native import build as native

OPS = native.load_native()
pytestmark = pytest.mark.skipif(
    OPS is None, reason="native CPU kernels unavailable (no compiler/ninja, or disabled)"
)
HQ, HKV = 9, 3


def indptr(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)


class Pool:
    """Random keys and values, and sequences of random slots with their queries (one per
    position: the query of the token at that position)."""

    def __init__(self, dtype: torch.dtype, head_dim: int = 64, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.k = torch.randn(6000, HKV, head_dim, generator=self.gen).to(dtype)
        self.v = torch.randn(6000, HKV, head_dim, generator=self.gen).to(dtype)
        self.free = torch.randperm(6000, generator=self.gen).tolist()
        self.dtype, self.head_dim = dtype, head_dim

    def sequence(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        slots = torch.tensor([self.free.pop() for _ in range(length)], dtype=torch.int64)
        q = torch.randn(length, HQ, self.head_dim, generator=self.gen).to(self.dtype)
        return slots, q


def attend(pool: Pool, parts, window: int = 0, cascades=((), ())) -> torch.Tensor:
    """parts: (slots, q, start, end) per sequence: its tokens start..end-1 (queries q[start:end])
    over keys slots[:end]. Returns the out rows of all of them, in order, with each row's
    float32 log-sum-exp appended to its D values (a bfloat16 output hides small differences;
    the lse shows them)."""
    q = torch.cat([qq[s:e] for _, qq, s, e in parts])
    qo = indptr([e - s for _, _, s, e in parts])
    kvp = indptr([e for _, _, _, e in parts])
    slots = torch.cat([sl[:e] for sl, _, _, e in parts])
    rows, prefixes = cascades
    out, lse = OPS.paged_attention(
        q, pool.k, pool.v, qo, kvp, slots, 0.125, window, list(rows), list(prefixes)
    )
    return torch.cat([out.float(), lse[..., None]], dim=-1)


def alone(pool: Pool, slots, q, position: int, window: int = 0) -> torch.Tensor:
    """The token at `position` as a decode step of its own."""
    return attend(pool, [(slots, q, position, position + 1)], window)[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_rows_equal_decode_steps(dtype, threads):
    """A 700-token prefill in one call, and in chunks of 1, 7, 16 and 512 tokens, gives each
    token exactly what it gets as a decode step alone (the decode tile against the general
    tile, chunk boundaries at 256 and 512 inside and outside the tiles)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        pool = Pool(dtype, seed=threads)
        slots, q = pool.sequence(700)
        whole = attend(pool, [(slots, q, 0, 700)])
        for chunk in (1, 7, 16, 512):
            pieces = [
                attend(pool, [(slots, q, s, min(s + chunk, 700))]) for s in range(0, 700, chunk)
            ]
            assert torch.equal(torch.cat(pieces), whole), f"chunks of {chunk}"
        for position in (0, 1, 63, 64, 255, 256, 257, 511, 512, 699):
            assert torch.equal(alone(pool, slots, q, position), whole[position]), position
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_row_does_not_depend_on_its_batch(dtype):
    """Decodes, verification-like steps of 4 tokens and a prefill chunk of mixed lengths in one
    batch of 2 to 64 sequences: each row equals the same step run alone."""
    pool = Pool(dtype, seed=7)
    seqs = [pool.sequence(length) for length in (5, 90, 300, 600, 1100, 257)]
    steps = [
        (sl, q, len(sl) - n, len(sl)) for (sl, q), n in zip(seqs, (1, 4, 1, 40, 1, 4), strict=True)
    ]
    singles = [attend(pool, [step]) for step in steps]
    for size in (2, 6, 17, 64):
        batch = [steps[i % len(steps)] for i in range(size)]
        out = attend(pool, batch)
        at = 0
        for i in range(size):
            n = batch[i][3] - batch[i][2]
            assert torch.equal(out[at : at + n], singles[i % len(steps)]), (size, i)
            at += n


def test_a_shared_prefix_cascade_changes_no_bit():
    """Decode rows of sequences sharing 600 keys: with a cascade over the first two chunks of
    the prefix (512 keys) each row equals its decode alone over all of its keys."""
    pool = Pool(torch.bfloat16, seed=3)
    prefix, prefix_q = pool.sequence(600)
    seqs = []
    for extra in (1, 30, 200):
        own, q = pool.sequence(extra)
        seqs.append((torch.cat([prefix, own]), torch.cat([prefix_q, q])))
    singles = [alone(pool, sl, q, len(sl) - 1) for sl, q in seqs]
    q = torch.cat([q[-1:] for _, q in seqs])
    own = torch.cat([sl[512:] for sl, _ in seqs])
    qo = indptr([1] * len(seqs))
    kvp = indptr([len(sl) - 512 for sl, _ in seqs])
    rows = torch.arange(len(seqs), dtype=torch.int64)
    out, lse = OPS.paged_attention(
        q, pool.k, pool.v, qo, kvp, own, 0.125, 0, [rows], [prefix[:512]]
    )
    out = torch.cat([out.float(), lse[..., None]], dim=-1)
    for i, single in enumerate(singles):
        assert torch.equal(out[i], single), i


@pytest.mark.parametrize("window", [5, 64, 100, 300])
def test_a_sliding_window_row_does_not_depend_on_its_chunk(window):
    """Gemma 3's local layers: a 400-token prefill, in chunks of 1 and 33, and each token's
    decode alone, agree bit for bit."""
    pool = Pool(torch.bfloat16, head_dim=128, seed=window)
    slots, q = pool.sequence(400)
    whole = attend(pool, [(slots, q, 0, 400)], window)
    for chunk in (1, 33):
        pieces = [
            attend(pool, [(slots, q, s, min(s + chunk, 400))], window) for s in range(0, 400, chunk)
        ]
        assert torch.equal(torch.cat(pieces), whole), chunk
    for position in (0, 4, 5, 63, 64, 199, 399):
        assert torch.equal(alone(pool, slots, q, position, window), whole[position]), position


@pytest.mark.parametrize("head_dim", [80, 256])
def test_head_sizes_without_a_decode_tile(head_dim):
    """Sizes the decode tile does not take run every row through the general tile: a prefill
    and the decodes of its tokens still agree."""
    pool = Pool(torch.bfloat16, head_dim=head_dim, seed=head_dim)
    slots, q = pool.sequence(300)
    whole = attend(pool, [(slots, q, 0, 300)])
    for position in (0, 100, 255, 256, 299):
        assert torch.equal(alone(pool, slots, q, position), whole[position]), position


def test_the_planner_cuts_cascades_at_the_kernels_chunks():
    from radixrt.attention.cpu_native import KEY_CHUNK

    assert OPS.attention_key_chunk() == KEY_CHUNK
