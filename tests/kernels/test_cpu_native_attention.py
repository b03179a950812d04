"""radixrt::paged_attention (radixrt/csrc/paged_attention.cpp) against softmax(QK^T)V in float64.

Tolerances: float32 inputs 2e-5 absolute on outputs of size ~1 (the kernel accumulates in
float32, its exp is accurate to ~2e-7); bfloat16 inputs 1e-2 on the output (it is rounded to
bfloat16, 2^-8 relative) and 1e-4 on the float32 log-sum-exp.
"""

from __future__ import annotations

import pytest
import torch

from radixrt import native
from radixrt.attention.torch_backend import TorchAttentionBackend

OPS = native.load_native()
needs_native = pytest.mark.skipif(
    OPS is None, reason="native CPU kernels unavailable (no compiler/ninja, or disabled)"
)
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (1e-2, 1e-4)}  # (out, lse)


def reference(kv, scale: float):
    """Per sequence: new token t of n sits at position L - n + t and sees keys 0..L - n + t."""
    hq, hkv = kv.q.shape[1], kv.k_buffer.shape[1]
    out = torch.empty(kv.q.shape, dtype=torch.float64)
    lse = torch.empty(kv.q.shape[:2], dtype=torch.float64)
    qo, kvp = kv.qo_indptr.tolist(), kv.kv_indptr.tolist()
    for b in range(len(qo) - 1):
        n, length = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b]
        slots = kv.kv_indices[kvp[b] : kvp[b + 1]]
        k = kv.k_buffer[slots].double().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        v = kv.v_buffer[slots].double().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        q = kv.q[qo[b] : qo[b + 1]].double().transpose(0, 1)  # [Hq, n, D]
        scores = q @ k.transpose(1, 2) * scale
        visible = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[qo[b] : qo[b + 1]] = (torch.softmax(scores, -1) @ v).transpose(0, 1)
        lse[qo[b] : qo[b + 1]] = torch.logsumexp(scores, -1).transpose(0, 1)
    return out, lse


def random_specs(gen: torch.Generator, count: int, max_new: int) -> list[tuple[int, int]]:
    """(prefix, new) pairs: lengths 1..300, decodes, short extends and longer chunks mixed."""
    specs = []
    for i in range(count):
        new = [1, 1, 3, max_new][i % 4]
        total = int(torch.randint(new, 301, (), generator=gen))
        specs.append((total - new, new))
    return specs


def check(kv, dtype: torch.dtype) -> None:
    scale = kv.q.shape[-1] ** -0.5
    out, lse = OPS.paged_attention(
        kv.q, kv.k_buffer, kv.v_buffer, kv.qo_indptr, kv.kv_indptr, kv.kv_indices, scale
    )
    ref_out, ref_lse = reference(kv, scale)
    out_tol, lse_tol = TOLERANCE[dtype]
    assert out.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, atol=out_tol, rtol=0)
    torch.testing.assert_close(lse.double(), ref_lse, atol=lse_tol, rtol=0)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (9, 3), (8, 2)])  # GQA groups 1, 3, 4
def test_ragged_batch_matches_float64_reference(paged_kv, dtype, head_dim, hq, hkv):
    gen = torch.Generator().manual_seed(hq * head_dim)
    specs = random_specs(gen, count=7, max_new=40)
    check(paged_kv(specs, hq, hkv, head_dim, page_size=16, dtype=dtype, seed=hkv), dtype)


@needs_native
def test_prefill_without_prefix_and_a_wide_group(paged_kv):
    """A long causal chunk with no cached keys, and 40 query heads per kv head (tiles split
    the group's heads), on single-slot pages."""
    check(paged_kv([(0, 300), (5, 1)], 40, 1, 64, page_size=1, seed=3), torch.float32)


@needs_native
def test_decode_batch_of_unequal_lengths(paged_kv):
    lengths = [1, 2, 300, 17, 64, 65, 129, 250]
    check(paged_kv([(n - 1, 1) for n in lengths], 9, 3, 64, page_size=4), torch.float32)


@needs_native
def test_mismatched_dtypes_are_refused(paged_kv):
    kv = paged_kv([(3, 1)], 4, 2, 64, page_size=4)
    with pytest.raises(RuntimeError, match="share one dtype"):
        OPS.paged_attention(
            kv.q.bfloat16(), kv.k_buffer, kv.v_buffer, kv.qo_indptr, kv.kv_indptr,
            kv.kv_indices, 0.125,
        )  # fmt: skip


def test_disabled_native_falls_back_to_torch(monkeypatch):
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    native.load_native.cache_clear()
    try:
        assert native.load_native() is None
        assert TorchAttentionBackend()._native is None
    finally:
        monkeypatch.delenv(native.DISABLE_ENV)
        native.load_native.cache_clear()


def test_build_key_follows_the_sources(tmp_path):
    src = tmp_path / "a.cpp"
    src.write_text("int a;")
    before = native.build_key([src])
    src.write_text("int b;")
    assert native.build_key([src]) != before
