"""The batch-invariant Triton attention (kernels/invariant_attention.py, selected by
--enable-deterministic-inference on CUDA), under the interpreter or compiled on a GPU
(tests/kernels/triton_device.py).

Each sequence's K/V lie once in a shared pool, with a query for every position; a test then
runs the same rows in different launches and compares them with `torch.equal`: a row alone
and beside 1-5 other sequences of other lengths, a prefill cut into chunks at different
places, a decode step against the same position in an extend batch, and several chunk-program
counts. Chunks of 64 keys (blocks of 32 in the interpreter) give several chunks per sequence
at small shapes, the decode tests chunks of 32 (4 in 100 keys: a fold of 2 cannot tell its
order); one test runs the default 256. A window of 40 crosses a chunk boundary. GQA 3: a
tile holds 5 tokens of 3 heads and one padding row, so a token's rows move inside the tile
as its chunk's start moves.
Tolerances against the reference as in test_decode_attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the `test` extra installs it)")

from triton_device import KERNEL_DEVICE_MARKS  # noqa: E402

from radixrt.kernels.decode_attention import choose_num_splits, decode_attention  # noqa: E402
from radixrt.kernels.extend_attention import extend_attention  # noqa: E402
from radixrt.kernels.invariant_attention import (  # noqa: E402
    decode_attention_invariant,
    extend_attention_invariant,
)
from radixrt.kernels.reference import paged_attention_ref  # noqa: E402

pytestmark = KERNEL_DEVICE_MARKS
HQ, HKV, D = 6, 2, 64
SCALE = D**-0.5
CHUNK = 64
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LENGTHS = [100, 9, 70, 1, 33, 80]  # the first is the row under test; the rest keep it company


@dataclass
class Sequences:
    """Whole sequences in one pool: each one's slots (position order) and a query per position."""

    k_buffer: torch.Tensor  # [pool, HKV, D]
    v_buffer: torch.Tensor
    slots: list[torch.Tensor]  # [L_s]
    queries: list[torch.Tensor]  # [L_s, HQ, D]


def sequences(paged_kv, lengths, hq=HQ, hkv=HKV, dtype=torch.float32) -> Sequences:
    batch = paged_kv([(0, n) for n in lengths], hq, hkv, D, 16, dtype)
    return Sequences(
        batch.k_buffer,
        batch.v_buffer,
        list(batch.kv_indices.split(lengths)),
        list(batch.q.split(lengths)),
    )


def _indptr(lengths: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(like.device)


def extend(seqs: Sequences, pieces, window=0, chunk=CHUNK, kernel=extend_attention_invariant):
    """pieces: (sequence, begin, end): its tokens begin..end-1 as new tokens after a cached
    prefix of `begin`. One launch; each piece's rows [end - begin, Hq, D]."""
    news = [end - begin for _, begin, end in pieces]
    q = torch.cat([seqs.queries[s][begin:end] for s, begin, end in pieces])
    slots = torch.cat([seqs.slots[s][:end] for s, _, end in pieces])
    kv_indptr = _indptr([end for _, _, end in pieces], slots)
    args = (seqs.k_buffer, seqs.v_buffer, _indptr(news, slots), kv_indptr, slots, max(news))
    extra = dict(chunk=chunk) if kernel is extend_attention_invariant else {}
    return list(kernel(q, *args, SCALE, window=window, **extra).split(news))


def decode(seqs: Sequences, pieces, window=0, bound="batch", chunk=CHUNK) -> torch.Tensor:
    """pieces: (sequence, position): that position's query over keys 0..position, one launch.
    bound: the max_seq_len passed ("batch": the longest here; an int; None)."""
    q = torch.stack([seqs.queries[s][p] for s, p in pieces])
    slots = torch.cat([seqs.slots[s][: p + 1] for s, p in pieces])
    lengths = [p + 1 for _, p in pieces]
    max_seq_len = max(lengths) if bound == "batch" else bound
    return decode_attention_invariant(
        q, seqs.k_buffer, seqs.v_buffer, _indptr(lengths, slots), slots, SCALE, max_seq_len,
        window=window, chunk=chunk,
    )  # fmt: skip


def reference(seqs: Sequences, pieces, window=0) -> list[torch.Tensor]:
    news = [end - begin for _, begin, end in pieces]
    q = torch.cat([seqs.queries[s][begin:end] for s, begin, end in pieces])
    slots = torch.cat([seqs.slots[s][:end] for s, _, end in pieces])
    kv_indptr = _indptr([end for _, _, end in pieces], slots)
    out = paged_attention_ref(
        q, seqs.k_buffer, seqs.v_buffer, _indptr(news, slots), kv_indptr, slots, SCALE, window
    )
    return list(out.split(news))


def chunked(seqs: Sequences, end: int, size: int, window: int, **kwargs) -> torch.Tensor:
    """Sequence 0's tokens 0..end-1 prefilled alone in chunks of `size`, one launch each."""
    starts = range(0, end, size)
    return torch.cat(
        [extend(seqs, [(0, b, min(b + size, end))], window, **kwargs)[0] for b in starts]
    )


@pytest.mark.parametrize("window", [0, 40])
def test_extend_rows_ignore_where_their_chunk_began(paged_kv, window):
    seqs = sequences(paged_kv, LENGTHS[:1])
    whole = extend(seqs, [(0, 0, 100)], window)[0]
    for size in (13, 40):
        assert torch.equal(chunked(seqs, 100, size, window), whole), size
    # A full radix hit: the last token alone after a cached prefix of 99.
    assert torch.equal(extend(seqs, [(0, 99, 100)], window)[0], whole[99:])
    torch.testing.assert_close(whole, reference(seqs, [(0, 0, 100)], window)[0], **_tol())


def _tol(dtype: torch.dtype = torch.float32) -> dict[str, float]:
    return dict(atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("window", [0, 40])
def test_extend_rows_ignore_their_batch(paged_kv, window):
    """Sequence 0's new tokens 70..99 alone, then beside 1 and 5 other sequences (prefills,
    single tokens), first and last."""
    seqs = sequences(paged_kv, LENGTHS)
    target = (0, 70, 100)
    others = [(1, 0, 9), (2, 60, 70), (3, 0, 1), (4, 32, 33), (5, 70, 80)]
    alone = extend(seqs, [target], window)[0]
    for n in (1, 5):
        for place in (0, n):
            pieces = others[:n]
            pieces.insert(place, target)
            assert torch.equal(extend(seqs, pieces, window)[place], alone), (n, place)


@pytest.mark.parametrize("window", [0, 40])
def test_decode_rows_ignore_their_batch(paged_kv, window):
    """Sequence 0's last position alone, then beside 1 to 5 others, and with more chunk
    programs than it needs (a CUDA graph's bound) or none known (one program folds all)."""
    seqs = sequences(paged_kv, LENGTHS)
    alone = decode(seqs, [(0, 99)], window, chunk=32)
    others = [(1, 8), (2, 69), (3, 0), (4, 32), (5, 79)]
    for n in range(1, len(others) + 1):
        got = decode(seqs, [*others[:n], (0, 99)], window, chunk=32)
        assert torch.equal(got[-1:], alone), n
    for bound in (512, None):
        got = decode(seqs, [(2, 69), (0, 99)], window, bound, chunk=32)
        assert torch.equal(got[1:], alone), bound


@pytest.mark.parametrize("window", [0, 40])
def test_a_decode_row_equals_the_same_row_in_an_extend_batch(paged_kv, window):
    """A batch mixing prefill chunks and decode steps runs the extend kernel: a decode step
    must give the same bits there as in a decode-only batch. Positions on both sides of a
    chunk boundary (63, 64) and the ends."""
    seqs = sequences(paged_kv, LENGTHS[:1])
    whole = extend(seqs, [(0, 0, 100)], window, chunk=32)[0]
    positions = [0, 40, 63, 64, 99]
    got = decode(seqs, [(0, p) for p in positions], window, chunk=32)
    assert torch.equal(got, whole[positions])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (8, 1)])  # GQA 1, 3, 8
def test_decode_matches_the_reference(paged_kv, dtype, hq, hkv):
    seqs = sequences(paged_kv, [100, 1, 64, 65], hq, hkv, dtype)
    pieces = [(s, len(q) - 1) for s, q in enumerate(seqs.queries)]
    whole = [(s, 0, p + 1) for s, p in pieces]
    for window in (0, 40):
        want = torch.cat([rows[-1:] for rows in reference(seqs, whole, window)])
        got = decode(seqs, pieces, window)
        assert got.dtype == dtype and not got.isnan().any()
        torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_extend_matches_the_reference_in_half_precision(paged_kv, dtype):
    seqs = sequences(paged_kv, LENGTHS[:3], dtype=dtype)
    pieces = [(0, 60, 100), (1, 0, 9), (2, 64, 70)]
    for got, want in zip(extend(seqs, pieces), reference(seqs, pieces), strict=True):
        torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))


def test_default_chunk_of_256(paged_kv):
    """The server's chunk: a 600-key sequence (three chunks) decoded, against its last rows
    prefilled after a cached prefix, and against the reference."""
    seqs = sequences(paged_kv, [600])
    tail = extend(seqs, [(0, 595, 600)], chunk=256)[0]
    got = decode(seqs, [(0, 599)], chunk=256)
    assert torch.equal(got, tail[-1:])
    torch.testing.assert_close(tail, reference(seqs, [(0, 595, 600)])[0], **_tol())


def test_an_empty_sequence_gives_zeros(paged_kv):
    """CUDA-graph padding rows have no keys: output 0, not NaN, the other row unchanged."""
    seqs = sequences(paged_kv, LENGTHS[:1])
    q = seqs.queries[0][[99, 0]]
    slots = seqs.slots[0]
    kv_indptr = _indptr([100, 0], slots)
    out = decode_attention_invariant(
        q, seqs.k_buffer, seqs.v_buffer, kv_indptr, slots, SCALE, 512, chunk=CHUNK
    )
    assert not out.isnan().any() and bool((out[1] == 0).all())
    assert torch.equal(out[:1], decode(seqs, [(0, 99)]))


def test_a_window_reads_no_key_before_it(paged_kv):
    """NaN in the K/V of every key before sequence 0's window (a block straddles its edge):
    a kernel that reads one, even masked, returns NaN."""
    seqs = sequences(paged_kv, LENGTHS[:1])
    want_decode = decode(seqs, [(0, 99)], 24)
    want_extend = extend(seqs, [(0, 90, 100)], 24)[0]
    unseen = seqs.slots[0][: 90 - 24 + 1]
    seqs.k_buffer[unseen] = float("nan")
    seqs.v_buffer[unseen] = float("nan")
    assert torch.equal(decode(seqs, [(0, 99)], 24), want_decode)
    assert torch.equal(extend(seqs, [(0, 90, 100)], 24)[0], want_extend)


def test_the_comparisons_catch_the_batch_shaped_kernels(paged_kv):
    """The same comparisons on the default kernels fail: their decode splits come from the
    batch size and the SM count (a 1,000-key sequence: 4 splits alone, 1 in a batch of 512 on
    132 SMs), and their extend blocks start where the prefix ends."""
    assert [choose_num_splits(n, HKV, 1000, 132) for n in (1, 512)] == [4, 1]
    seqs = sequences(paged_kv, LENGTHS[:1])
    q = seqs.queries[0][99:100]
    slots = seqs.slots[0]
    outs = [
        decode_attention(
            q, seqs.k_buffer, seqs.v_buffer, _indptr([100], slots), slots, SCALE, splits
        )  # fmt: skip
        for splits in (1, 4)
    ]
    assert not torch.equal(outs[0], outs[1])
    whole = extend(seqs, [(0, 0, 100)], kernel=extend_attention)[0]
    assert not torch.equal(chunked(seqs, 100, 13, 0, kernel=extend_attention), whole)
