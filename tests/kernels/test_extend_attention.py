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


def check(batch, dtype: torch.dtype) -> torch.Tensor:
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
    )
    want = paged_attention_ref(
        batch.q,
        batch.k_buffer,
        batch.v_buffer,
        batch.qo_indptr,
        batch.kv_indptr,
        batch.kv_indices,
        scale,
    )
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
