"""Paged extend (prefill) attention against the torch reference,
under the interpreter or compiled on a GPU (tests/kernels/triton_device.py).

Tolerances as in test_decode_attention: float32 1e-5, float16 2e-3, bfloat16 1.6e-2.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the `test` extra installs it)")

from triton_device import KERNEL_DEVICE_MARKS  # noqa: E402

from radixrt.kernels.extend_attention import extend_attention  # noqa: E402
from radixrt.kernels.reference import paged_attention_ref  # noqa: E402

pytestmark = KERNEL_DEVICE_MARKS
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# (prefix, new) per sequence: no prefix; a prefix ending mid-page (21 with pages of 16); a
# single new token after a prefix (a decode step in a mixed batch); a whole-page prefix and
# more new tokens than one block of queries.
RAGGED = [(0, 5), (21, 7), (16, 1), (3, 20)]


def reference(batch, window: int = 0) -> torch.Tensor:
    return paged_attention_ref(
        batch.q,
        batch.k_buffer,
        batch.v_buffer,
        batch.qo_indptr,
        batch.kv_indptr,
        batch.kv_indices,
        batch.q.shape[-1] ** -0.5,
        window,
    )


def check(batch, dtype: torch.dtype, window: int = 0, want=None) -> torch.Tensor:
    """The kernel against the reference (or against `want`, computed before the caller changed
    the pool)."""
    scale = batch.q.shape[-1] ** -0.5
    out = extend_attention(
        batch.q,
        batch.k_buffer,
        batch.v_buffer,
        batch.qo_indptr,
        batch.kv_indptr,
        batch.kv_indices,
        batch.max_new_tokens,
        scale,
        window=window,
    )
    if want is None:
        want = reference(batch, window)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    return out


@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (8, 2), (8, 1)])  # GQA 1, 3, 4, 8
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("page_size", [1, 16])
def test_gqa_head_dims_pages(paged_kv, hq, hkv, head_dim, page_size):
    check(paged_kv(RAGGED, hq, hkv, head_dim, page_size), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(paged_kv, dtype):
    check(paged_kv(RAGGED, 8, 2, 64, 16, dtype), dtype)


def test_no_prefix_single_sequence(paged_kv):
    check(paged_kv([(0, 9)], 6, 2, 64, 1), torch.float32)


def test_single_token_sequences(paged_kv):
    # A prompt of one token (nothing to attend to but itself), and decode-like rows.
    check(paged_kv([(0, 1), (5, 1), (0, 1)], 4, 2, 64, 16), torch.float32)


def test_long_prefix_short_extend(paged_kv):
    # A radix-cache hit: a long cached prefix (several key blocks), two new tokens.
    check(paged_kv([(150, 2), (40, 3)], 4, 1, 64, 16), torch.float32)


def test_prefix_is_read_from_the_pool(paged_kv):
    """Changing a prefix slot's V changes the output: the kernel reads the cached prefix where
    it lies (through kv_indices) instead of assuming anything about it."""
    batch = paged_kv([(10, 3)], 4, 2, 64, 16)
    before = check(batch, torch.float32)
    slot = int(batch.kv_indices[4])
    batch.v_buffer[slot] += 5.0
    after = check(batch, torch.float32)
    assert (after - before).abs().max() > 1e-3


# Sliding windows over RAGGED (lengths 5, 28, 17, 23): 1 (each token sees itself alone); 4
# (the band's lower edge inside a block of new tokens, a program's first key past the prefix);
# 17 (shorter than two sequences, equal to one, longer than one); 64 (longer than all: causal).
@pytest.mark.parametrize("window", [1, 4, 17, 64])
def test_sliding_window(paged_kv, window):
    check(paged_kv(RAGGED, 4, 1, 64, 16), torch.float32, window)


def poison_before_window(batch, window: int) -> None:
    """NaN into the K/V of every key that no new token of its sequence sees (positions before
    the first new token's window): a kernel that reads one, even masked, returns NaN."""
    for b in range(batch.qo_indptr.numel() - 1):
        kv0, kv1 = int(batch.kv_indptr[b]), int(batch.kv_indptr[b + 1])
        first_pos = (kv1 - kv0) - int(batch.qo_indptr[b + 1] - batch.qo_indptr[b])
        unseen = batch.kv_indices[kv0 : kv0 + max(first_pos - window + 1, 0)]
        batch.k_buffer[unseen] = float("nan")
        batch.v_buffer[unseen] = float("nan")


def test_window_does_not_read_a_prefix_outside_it(paged_kv):
    # A long radix-cache hit (150 keys, several key blocks) of which a window of 8 sees only the
    # end, and a prefix of 40 before 20 new tokens; GQA 3.
    batch = paged_kv([(150, 3), (40, 20)], 6, 2, 64, 16)
    want = reference(batch, 8)
    poison_before_window(batch, 8)
    check(batch, torch.float32, 8, want)


def brute_force(batch, window: int) -> torch.Tensor:
    """Attention from its definition, one query and head at a time over the explicit list of
    the keys it sees (positions max(0, p - W + 1) .. p, or 0 .. p for W = 0), in float64."""
    out = torch.zeros(batch.q.shape, dtype=torch.float64)
    group = batch.q.shape[1] // batch.k_buffer.shape[1]
    for b in range(batch.qo_indptr.numel() - 1):
        q0, q1 = int(batch.qo_indptr[b]), int(batch.qo_indptr[b + 1])
        slots = batch.kv_indices[int(batch.kv_indptr[b]) : int(batch.kv_indptr[b + 1])].tolist()
        for i in range(q1 - q0):
            p = len(slots) - (q1 - q0) + i
            seen = slots[max(0, p - window + 1) if window else 0 : p + 1]
            for h in range(batch.q.shape[1]):
                k = batch.k_buffer[seen, h // group].double().cpu()  # [keys, D]
                v = batch.v_buffer[seen, h // group].double().cpu()
                scores = k @ batch.q[q0 + i, h].double().cpu() * batch.q.shape[-1] ** -0.5
                out[q0 + i, h] = scores.softmax(0) @ v
    return out


@pytest.mark.parametrize("window", [0, 1, 3])
def test_reference_against_brute_force(paged_kv, window):
    """The reference every windowed kernel test trusts, against the definition."""
    batch = paged_kv([(4, 3), (0, 2), (1, 1)], 4, 2, 8, 2)
    got = reference(batch, window).double().cpu()
    torch.testing.assert_close(got, brute_force(batch, window), atol=1e-5, rtol=1e-5)
