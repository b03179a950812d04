"""dense_linear (radixrt/layers/fused.py): float32 CPU matmuls through oneDNN, other dtypes and
devices through F.linear. oneDNN sums in another order than aten's BLAS, so the two agree up to
float32 rounding: both are held to the classic bound for a length-K dot product,
|y - exact| <= K * eps * (|x| @ |W|.T), against a float64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.layers import fused
from radixrt.layers.fused import dense_linear

needs_onednn = pytest.mark.skipif(not fused.ONEDNN, reason="torch built without oneDNN")


def rounding_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    k = x.shape[-1]
    return k * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_matmul_is_a_float32_matmul(rows, bias):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 576, generator=g), torch.randn(1536, 576, generator=g)
    b = torch.randn(1536, generator=g) if bias else None
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    bound = rounding_bound(x, w) + (0 if b is None else 1e-6 * b.double().abs())
    ours, aten = dense_linear(x, w, b), F.linear(x, w, b)
    assert ours.dtype == torch.float32 and ours.shape == (rows, 1536)
    assert bool(((ours.double() - exact).abs() <= bound).all())
    assert bool(((aten.double() - exact).abs() <= bound).all())
    assert not torch.equal(ours, torch.zeros_like(ours))


@needs_onednn
def test_leading_dims_strides_and_empty_inputs():
    w = torch.randn(24, 32)
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(dense_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    xt = torch.randn(32, 6).T  # a transposed view
    torch.testing.assert_close(dense_linear(xt, w), F.linear(xt, w), rtol=1e-5, atol=1e-5)
    assert dense_linear(torch.randn(0, 32), w).shape == (0, 24)


def test_other_dtypes_and_no_onednn_take_f_linear(monkeypatch):
    x, w = torch.randn(4, 32).bfloat16(), torch.randn(8, 32).bfloat16()
    assert torch.equal(dense_linear(x, w), F.linear(x, w))
    monkeypatch.setattr(fused, "ONEDNN", False)
    x, w = torch.randn(4, 32), torch.randn(8, 32)
    assert torch.equal(dense_linear(x, w), F.linear(x, w))
