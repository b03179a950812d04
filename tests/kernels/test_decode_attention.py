"""Split-KV paged decode attention against the torch reference,
under the interpreter or compiled on a GPU (tests/kernels/triton_device.py).

Tolerances (max abs and relative difference): float32 1e-5, the reference being float32 too;
float16 2e-3 (one half-precision step near 1); bfloat16 1.6e-2 (one bfloat16 step near 2:
the interpreter truncates where the GPU rounds to nearest).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the `test` extra installs it)")

from triton_device import KERNEL_DEVICE_MARKS  # noqa: E402

from radixrt.kernels.decode_attention import (  # noqa: E402
    MAX_SPLITS,
    choose_num_splits,
    decode_attention,
)
from radixrt.kernels.reference import decode_attention_ref  # noqa: E402

pytestmark = KERNEL_DEVICE_MARKS
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Ragged decode batch: (prefix, 1) per sequence; lengths 1 (the new token alone), 18 and 33
# (mid-page with pages of 16), 40.
RAGGED = [(0, 1), (17, 1), (39, 1), (32, 1)]


def reference(batch, window: int = 0) -> torch.Tensor:
    return decode_attention_ref(
        batch.q,
        batch.k_buffer,
        batch.v_buffer,
        batch.kv_indptr,
        batch.kv_indices,
        batch.q.shape[-1] ** -0.5,
        window,
    )


def check(batch, dtype: torch.dtype, num_splits: int, window: int = 0, want=None) -> None:
    """The kernel against the reference (or against `want`, computed before the caller changed
    the pool)."""
    scale = batch.q.shape[-1] ** -0.5
    out = decode_attention(
        batch.q,
        batch.k_buffer,
        batch.v_buffer,
        batch.kv_indptr,
        batch.kv_indices,
        scale,
        num_splits,
        window=window,
    )
    if want is None:
        want = reference(batch, window)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (8, 2), (8, 1)])  # GQA 1, 3, 4, 8
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("page_size", [1, 16])
def test_gqa_head_dims_pages(paged_kv, hq, hkv, head_dim, page_size):
    batch = paged_kv(RAGGED, hq, hkv, head_dim, page_size)
    # Splits of 1 (no merge to speak of) and 3 (uneven chunks, empty ones for short rows).
    check(batch, torch.float32, num_splits=1 if page_size == 1 else 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(paged_kv, dtype):
    check(paged_kv(RAGGED, 8, 2, 64, 16, dtype), dtype, num_splits=4)


def test_many_splits_long_sequence(paged_kv):
    # More splits than a short sequence has keys: most chunks are empty and must weigh 0.
    check(paged_kv([(150, 1), (2, 1)], 6, 2, 64, 16), torch.float32, num_splits=16)


def test_empty_sequence_gives_zeros(paged_kv):
    """CUDA-graph padding rows have no keys: output 0, not NaN, and the others unaffected."""
    batch = paged_kv([(20, 1), (0, 1)], 4, 2, 64, 16)
    batch.kv_indptr[2] = batch.kv_indptr[1]  # the second sequence now has length 0
    scale = 64**-0.5
    out = decode_attention(
        batch.q, batch.k_buffer, batch.v_buffer, batch.kv_indptr, batch.kv_indices, scale, 2
    )
    assert not out.isnan().any() and bool((out[1] == 0).all())
    want = decode_attention_ref(
        batch.q[:1], batch.k_buffer, batch.v_buffer, batch.kv_indptr[:2], batch.kv_indices, scale
    )
    torch.testing.assert_close(out[:1], want, atol=1e-5, rtol=1e-5)


def test_split_count_follows_the_batch():
    # Few long sequences: many splits; a full batch: one; short sequences: no pointless splits.
    assert choose_num_splits(1, 8, 32768, 132) == MAX_SPLITS
    assert choose_num_splits(64, 8, 4096, 132) == 2
    assert choose_num_splits(256, 8, 4096, 132) == 1
    assert choose_num_splits(1, 8, 300, 132) == 2
    assert choose_num_splits(1, 8, None, 132) == MAX_SPLITS  # CUDA graphs: any length
    for batch in (1, 3, 17, 64):
        n = choose_num_splits(batch, 2, 5000, 132)
        assert n & (n - 1) == 0 and 1 <= n <= MAX_SPLITS


# Sliding windows over RAGGED (lengths 1, 18, 40, 33), GQA 3, 3 uneven splits of the window:
# 1 (the token itself); 18 (shorter than two sequences, equal to one, longer than one); 64
# (longer than all). One split: the window's keys in one program.
@pytest.mark.parametrize("window,num_splits", [(1, 3), (18, 3), (64, 3), (18, 1)])
def test_sliding_window(paged_kv, window, num_splits):
    check(paged_kv(RAGGED, 6, 2, 64, 16), torch.float32, num_splits, window)


def test_window_does_not_read_keys_before_it(paged_kv):
    """NaN in the K/V of every key before the window: a kernel (or a split) that reads one, even
    masked, returns NaN. A long sequence, one shorter than the window, one just past it; GQA 4."""
    batch = paged_kv([(150, 1), (5, 1), (16, 1)], 8, 2, 64, 16)
    want = reference(batch, 16)
    for b in range(3):
        kv0, kv1 = int(batch.kv_indptr[b]), int(batch.kv_indptr[b + 1])
        unseen = batch.kv_indices[kv0 : max(kv1 - 16, kv0)]
        batch.k_buffer[unseen] = float("nan")
        batch.v_buffer[unseen] = float("nan")
    check(batch, torch.float32, 4, 16, want)
