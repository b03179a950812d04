"""int8 copies for wide batches (`--cpu-dense-copy-dtype int8`, W8A8): the native op against its
torch twin bit for bit, against the exact product within the rounding it states, the same row
in any batch, and the flag's rules."""

from __future__ import annotations

import pytest
import torch

from radixrt.layers.quantized import (
    COPY_FROM_ROWS,
    GGUFWeight,
    quantize,
    quantize_channels,
    w8a8_reference,
)
from radixrt.loader.quantize import keep_dense_copies
from radixrt.native.build import load_native
from radixrt.server_args import ServerArgs

needs_native = pytest.mark.skipif(
    load_native() is None, reason="radixrt's native CPU ops did not build (no compiler?)"
)


def _x(m: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    x[0] = 0  # a row of zeros: scale 0, codes 0, output 0
    return x.to(dtype)


def _w(n: int, k: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[1] = 0  # a channel of zeros
    return quantize_channels(w)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 40), (37, 576, 1536), (64, 100, 33)])
def test_the_native_op_is_its_torch_twin_bit_for_bit(dtype, m, k, n):
    # k = 100 and n = 33 leave tails after the 16-lane vectors.
    x = _x(m, k, dtype)
    wq, ws = _w(n, k)
    ours = torch.ops.radixrt.w8a8_linear(x, wq, ws)
    assert ours.dtype == dtype and ours.shape == (m, n)
    assert torch.equal(ours, w8a8_reference(x, wq, ws))
    assert torch.equal(ours[0], torch.zeros(n, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_error_is_within_the_activations_half_step(dtype):
    # Against float64 on the int8 weights' values, the only errors are x's rounding to its
    # grid (at most half a step, max|x| / 254, per element) and the output's rounding to dtype.
    x = _x(48, 256, dtype, seed=5)
    wq, ws = _w(96, 256, seed=6)
    w = wq.double() * ws.double()[:, None]
    exact = x.double() @ w.T
    half_step = x.double().abs().amax(dim=1, keepdim=True) / 254
    bound = half_step * w.abs().sum(dim=1)[None, :]
    output_rounding = exact.abs() * (2**-8 if dtype == torch.bfloat16 else 2**-23)
    error = (w8a8_reference(x, wq, ws).double() - exact).abs()
    assert (error <= bound + output_rounding + 1e-12).all()
    assert error.max() > 0  # it does round: the bound is what is being checked


@needs_native
def test_a_row_gives_the_same_bits_in_any_batch():
    # Integer sums are exact and each row has its own scale: batching changes nothing.
    x = _x(64, 576, torch.bfloat16, seed=2)
    wq, ws = _w(200, 576)
    whole = torch.ops.radixrt.w8a8_linear(x, wq, ws)
    for rows in (slice(5, 6), slice(3, 40), slice(0, 64, 3)):
        assert torch.equal(torch.ops.radixrt.w8a8_linear(x[rows], wq, ws), whole[rows])


def test_quantize_channels_keeps_each_weight_within_half_a_step():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(16, 96, generator=g)
    wq, ws = quantize_channels(w)
    assert wq.dtype == torch.int8 and ws.shape == (16,)
    assert wq.abs().amax(dim=1).eq(127).all()  # each channel's largest weight is +-127
    assert ((wq.float() * ws[:, None] - w).abs() <= ws[:, None] / 2 + 1e-7).all()


@needs_native
def test_int8_copies_serve_wide_inputs_and_the_blocks_narrow_ones():
    g = torch.Generator().manual_seed(3)
    layer = GGUFWeight(quantize(torch.randn(64, 96, generator=g) * 0.05, "int4"), "int4", 96)
    narrow_before = layer(_x(4, 96, torch.bfloat16))
    layer.keep_dense("int8")
    assert layer.dense is not None and layer.dense.dtype == torch.int8
    assert layer.dense_scale is not None and layer.dense_scale.shape == (64,)
    assert torch.equal(layer(_x(4, 96, torch.bfloat16)), narrow_before)  # below 12 rows
    wide = _x(COPY_FROM_ROWS, 96, torch.bfloat16)
    assert torch.equal(layer(wide), w8a8_reference(wide, layer.dense, layer.dense_scale))


def test_int8_copies_take_half_the_budget_of_bfloat16_ones():
    from radixrt.layers.quantized import can_keep_dense

    if not can_keep_dense():
        pytest.skip("dense copies need oneDNN and a bf16 CPU")
    model = torch.nn.Sequential(
        GGUFWeight(quantize(torch.randn(64, 64) * 0.05, "int4"), "int4", 64)
    )
    need = 64 * 64  # one byte a weight
    assert keep_dense_copies(model, (need - 1) / 2**30, "int8") == 0
    assert keep_dense_copies(model, need / 2**30, "int8") == 1
    assert model[0].dense.dtype == torch.int8


def test_an_unknown_copy_dtype_is_refused_by_name():
    with pytest.raises(
        ValueError, match=r"cpu_dense_copy_dtype must be one of \['bfloat16', 'int8'\], got 'fp8'"
    ):
        ServerArgs(cpu_dense_copy_dtype="fp8")
    with pytest.raises(ValueError, match="cpu_dense_copy_dtype must be one of"):
        keep_dense_copies(torch.nn.Sequential(), 1.0, "int4")
    layer = GGUFWeight(quantize(torch.randn(8, 32), "int4"), "int4", 32)
    with pytest.raises(ValueError, match="dense copy dtype must be one of"):
        layer.keep_dense("float16")


@needs_native
def test_the_op_names_a_bad_weight():
    x = _x(2, 64, torch.bfloat16)
    wq, ws = _w(8, 64)
    with pytest.raises(RuntimeError, match="weight must be contiguous int8"):
        torch.ops.radixrt.w8a8_linear(x, wq.float(), ws)
    with pytest.raises(RuntimeError, match="w_scale must be contiguous float32"):
        torch.ops.radixrt.w8a8_linear(x, wq, ws[:4])


def test_int8_copies_asked_for_under_float32_are_refused_in_the_log(tiny_model_dir, caplog):
    from radixrt.loader.load import load_model

    with caplog.at_level("WARNING", logger="radixrt.loader"):
        model, _ = load_model(
            tiny_model_dir("llama"), torch.float32, "cpu", quantization="int4",
            dense_copy_gb=1.0, dense_copy_dtype="int8",
        )  # fmt: skip
    assert "cpu_dense_copy_dtype int8 ignored" in caplog.text
    assert all(m.dense is None for m in model.modules() if isinstance(m, GGUFWeight))
