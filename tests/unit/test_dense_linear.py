"""dense_linear (radixrt/layers/fused.py): float32 and bfloat16 CPU matmuls through radixrt's
kernel (native/csrc/float_matmul.cpp), which sums each output in one order whatever the row
count; other dtypes, devices and builds through F.linear. The sums are held to the classic
bound for a length-K dot product, |y - exact| <= K * eps * (|x| @ |W|.T), against float64,
and a row's bits must not depend on the rows beside it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.layers import fused
from radixrt.layers.fused import dense_linear
from radixrt.native.build import load_native

needs_native = pytest.mark.skipif(load_native() is None, reason="native CPU kernels not built")


def rounding_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    k = x.shape[-1]
    return k * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T)


@needs_native
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_a_float32_matmul_within_rounding(rows, bias):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 576, generator=g), torch.randn(1536, 576, generator=g)
    b = torch.randn(1536, generator=g) if bias else None
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    bound = rounding_bound(x, w) + (0 if b is None else 1e-6 * b.double().abs())
    ours = dense_linear(x, w, b)
    assert ours.dtype == torch.float32 and ours.shape == (rows, 1536)
    assert bool(((ours.double() - exact).abs() <= bound).all())
    assert not torch.equal(ours, torch.zeros_like(ours))


@needs_native
def test_bfloat16_is_the_float32_sum_rounded_once():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 200, generator=g).bfloat16()
    w = torch.randn(50, 200, generator=g).bfloat16()
    b = torch.randn(50, generator=g).bfloat16()
    ours = dense_linear(x, w, b)
    assert ours.dtype == torch.bfloat16
    wide = dense_linear(x.float(), w.float(), b.float())  # the same sums, not yet rounded
    assert torch.equal(ours, wide.bfloat16())


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 100, 7])
def test_a_rows_result_does_not_depend_on_its_batch(dtype, k):
    # k = 100 and 7: a partial last vector (8 or 16 lanes); 29 outputs: no column group
    # (3 or 6) divides it. 1 and 2 threads, any batch of 1-70 rows, with and without a bias.
    g = torch.Generator().manual_seed(k)
    x, w = torch.randn(70, k, generator=g).to(dtype), torch.randn(29, k, generator=g).to(dtype)
    b = torch.randn(29, generator=g).to(dtype)
    threads = torch.get_num_threads()
    try:
        for bias in (None, b):
            batch = dense_linear(x, w, bias)
            for count in (1, 2):
                torch.set_num_threads(count)
                alone = torch.cat([dense_linear(x[i : i + 1], w, bias) for i in range(70)])
                assert torch.equal(batch, alone), f"{count} threads"
                for rows in (2, 5, 33):
                    assert torch.equal(dense_linear(x[3 : 3 + rows], w, bias), batch[3 : 3 + rows])
    finally:
        torch.set_num_threads(threads)
    exact = x.double() @ w.double().T
    bound = rounding_bound(x.float(), w.float())
    if dtype == torch.bfloat16:
        bound = bound + 2.0**-8 * exact.abs()
    assert bool(((dense_linear(x, w).double() - exact).abs() <= bound).all())


@needs_native
def test_leading_dims_strides_and_empty_inputs():
    w = torch.randn(24, 32)
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(dense_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    xt = torch.randn(32, 6).T  # a transposed view
    torch.testing.assert_close(dense_linear(xt, w), F.linear(xt, w), rtol=1e-5, atol=1e-5)
    wt = torch.randn(32, 24).T  # and a transposed weight
    torch.testing.assert_close(dense_linear(xt, wt), F.linear(xt, wt), rtol=1e-5, atol=1e-5)
    assert dense_linear(torch.randn(0, 32), w).shape == (0, 24)


def test_other_dtypes_and_no_native_build_take_f_linear(monkeypatch):
    x, w = torch.randn(4, 32).half(), torch.randn(8, 32).half()
    assert torch.equal(dense_linear(x, w), F.linear(x, w))
    monkeypatch.setattr(fused, "native_cpu", lambda t: None)
    x, w = torch.randn(4, 32), torch.randn(8, 32)
    assert torch.equal(dense_linear(x, w), F.linear(x, w))
