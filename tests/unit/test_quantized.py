"""GGUF-block weights (radixrt/layers/quantized.py): the byte layout against the gguf package's
own (de)quantizers, the native matmul against the float reference, and --quantization's rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from radixrt.layers import quantized
from radixrt.layers.fused import dense_linear
from radixrt.layers.gguf_blocks import block_type, dequantize_part
from radixrt.layers.quantized import GGUFWeight, quantize
from radixrt.native.build import load_native
from radixrt.native.cpu import cpu_has_bf16

GGUF_TYPE = {"int4": T.Q4_1, "int8": T.Q8_0}
# The native kernel sums each row in float32 in its own order: relative to the float64
# reference its error is a few float32 ulps of the largest output.
KERNEL_RTOL = 2e-6

needs_native = pytest.mark.skipif(
    load_native() is None, reason="radixrt's native CPU ops did not build (no compiler?)"
)


def dequantize(blocks: torch.Tensor, fmt: str, in_features: int) -> torch.Tensor:
    return dequantize_part(block_type(fmt), blocks, in_features)


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0, :32] = 0.25  # a block of equal weights: d = 0
    return w


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_our_blocks_read_as_gguf_reads_them(fmt):
    blocks = quantize(_weights(6, 96), fmt)
    theirs = gguf_dequantize(blocks.numpy(), GGUF_TYPE[fmt])
    assert torch.equal(dequantize(blocks, fmt, 96), torch.from_numpy(np.asarray(theirs)))


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_gguf_files_blocks_read_as_gguf_reads_them(fmt):
    w = _weights(5, 64, seed=1).numpy()
    blocks = gguf_quantize(w, GGUF_TYPE[fmt])
    ours = dequantize(torch.from_numpy(blocks), fmt, 64)
    assert torch.equal(ours, torch.from_numpy(gguf_dequantize(blocks, GGUF_TYPE[fmt])))


@pytest.mark.parametrize("fmt, levels", [("int4", 15), ("int8", 254)])
def test_quantization_error_is_at_most_half_a_step(fmt, levels):
    w = _weights(8, 256, seed=3)
    back = dequantize(quantize(w, fmt), fmt, 256)
    blocks = w.reshape(8, -1, 32)
    if fmt == "int4":
        step = (blocks.amax(-1) - blocks.amin(-1)) / levels
    else:
        step = 2 * blocks.abs().amax(-1) / levels
    err = (back - w).abs().reshape(8, -1, 32).amax(-1)
    # Half a step, plus the fp16 rounding of the scale (and minimum) applied to 15 or 127 codes.
    assert bool((err <= step * 0.5 + step * 2e-3 + 1e-7).all())


def test_quantize_rejects_bad_shapes_and_formats():
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize(torch.zeros(2, 40), "int4")
    with pytest.raises(ValueError, match=r"must be one of \['int4', 'int8'\]"):
        quantize(torch.zeros(2, 64), "int2")
    with pytest.raises(ValueError, match="do not hold 96 inputs"):
        GGUFWeight(quantize(torch.zeros(2, 64), "int4"), "int4", 96)


@needs_native
@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 31, 32, 70])
def test_native_matmul_matches_the_float_reference(fmt, rows):
    # rows < DENSE_FROM_ROWS: the block kernel (1-4 rows at a time); from it on: expand + BLAS.
    w = _weights(40, 160, seed=rows)
    weight = GGUFWeight(quantize(w, fmt), fmt, 160)
    weight.int8_rows = 0  # float32 activations (test_gguf_blocks.py bounds the int8 ones)
    x = torch.randn(rows, 160, generator=torch.Generator().manual_seed(7))
    ref = x.double() @ weight.dequantize().double().T
    y = weight(x)
    assert y.dtype == torch.float32 and y.shape == (rows, 40)
    assert (y.double() - ref).abs().max() <= KERNEL_RTOL * ref.abs().max()


@needs_native
@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_native_dequantize_is_the_reference_bit_for_bit(fmt):
    # The wide path's AVX2 expansion: d * q + m, a product then a sum, as the reference.
    blocks = quantize(_weights(37, 1536, seed=4), fmt)
    native = torch.ops.radixrt.gguf_dequantize(GGUFWeight(blocks, fmt, 1536).packed)
    assert torch.equal(native, dequantize(blocks, fmt, 1536))


@needs_native
@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("rows, out_features", [(64, 301), (300, 1000)])
def test_wide_matmul_over_many_tiles_matches_the_float_reference(fmt, rows, out_features):
    # Several tiles per thread, a last tile shorter than the others, tiles growing with rows;
    # under inference mode, as the engine runs (the threads writing y must be in it too).
    weight = GGUFWeight(quantize(_weights(out_features, 1536, seed=5), fmt), fmt, 1536)
    weight.int8_rows = 0  # the float paths (test_gguf_blocks.py bounds the int8 kernel)
    x = torch.randn(rows, 1536, generator=torch.Generator().manual_seed(8))
    ref = x.double() @ weight.dequantize().double().T
    with torch.inference_mode():
        y = weight(x)
    assert (y.double() - ref).abs().max() <= KERNEL_RTOL * ref.abs().max()


@needs_native
def test_native_matmul_keeps_the_input_dtype_and_leading_dims():
    weight = GGUFWeight(quantize(_weights(16, 64), "int4"), "int4", 64)
    x = torch.randn(2, 3, 64).bfloat16()
    y = weight(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 16)
    ref = F.linear(x.float(), weight.dequantize())
    assert (y.float() - ref).abs().max() <= 0.02 * ref.abs().max()  # bfloat16's rounding


def test_torch_fallback_equals_dequantize_then_linear(monkeypatch):
    monkeypatch.setattr(quantized, "native_ops_loaded", lambda: False)
    weight = GGUFWeight(quantize(_weights(16, 64), "int8"), "int8", 64)
    x = torch.randn(3, 64)
    assert torch.equal(weight(x), dense_linear(x, weight.dequantize()))


@needs_native
def test_native_op_names_bad_arguments():
    blocks = quantize(_weights(4, 64), "int4")
    packed = GGUFWeight(blocks, "int4", 64).packed
    with pytest.raises(RuntimeError, match="must be a packed uint8 tensor"):
        torch.ops.radixrt.gguf_linear(torch.randn(1, 64), blocks, 4, 32, 8)
    with pytest.raises(RuntimeError, match="x has 96 features, the weight 64"):
        torch.ops.radixrt.gguf_linear(torch.randn(1, 96), packed, 4, 32, 8)
    with pytest.raises(RuntimeError, match="the weight has 4 rows, not 5"):
        torch.ops.radixrt.gguf_linear(torch.randn(1, 64), packed, 5, 32, 8)


@needs_native
@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("rows", [1, 5, 31, 32, 300])
def test_bfloat16_inputs_stay_bfloat16_within_its_rounding(fmt, rows):
    # Below DENSE_FROM_ROWS the block kernel in float32, then one rounding of the output (2^-8
    # relative); from it on the expanded tiles are rounded to bfloat16 as well and multiplied
    # in bfloat16 with float32 sums: 1% of the largest output covers both, not a wrong block.
    weight = GGUFWeight(quantize(_weights(300, 1536, seed=rows), fmt), fmt, 1536)
    weight.int8_rows = 0  # the float paths
    x = torch.randn(rows, 1536, generator=torch.Generator().manual_seed(9)).bfloat16()
    ref = x.double() @ weight.dequantize().double().T
    with torch.inference_mode():
        y = weight(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 300)
    assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
    if rows >= quantized.DENSE_FROM_ROWS and cpu_has_bf16():
        # The tiles are the bf16 weights `--quantization none` would hold, in the same matmul
        # (tiling the output columns does not reorder any one output's sum). A CPU without
        # bf16 units widens x and multiplies float32 tiles instead (gguf_linear.cpp).
        assert torch.equal(y, F.linear(x, weight.dequantize().bfloat16()))


needs_dense_copy = pytest.mark.skipif(
    not quantized.can_keep_dense(), reason="dense copies need oneDNN and a bf16 CPU"
)


@needs_native
@needs_dense_copy
@pytest.mark.parametrize("rows", [1, 11, 12, 31, 32, 300])
def test_a_dense_copy_serves_wide_bfloat16_inputs_only(rows):
    """From COPY_FROM_ROWS rows a bf16 input multiplies the bf16 copy (oneDNN): the same
    weights, so within bf16's rounding of the block kernel's result; below, the blocks."""
    weight = GGUFWeight(quantize(_weights(300, 576, seed=rows), "int4"), "int4", 576)
    weight.int8_rows = 0  # copies serve only steps that int8 activations leave
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(3)).bfloat16()
    with torch.inference_mode():
        blocks_only = weight(x)
        weight.keep_dense()
        assert weight.dense is not None and weight.dense.is_mkldnn
        y = weight(x)
        y_float = weight(x.float())  # float32 inputs never take the copy
    ref = x.double() @ weight.dequantize().double().T
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 300)
    assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
    if rows < quantized.COPY_FROM_ROWS:
        assert torch.equal(y, blocks_only)
    else:
        copy = torch.ops.mkldnn._linear_pointwise.default(x, weight.dense, None, "none", [], "")
        assert torch.equal(y, copy)
    assert torch.equal(
        y_float, torch.ops.radixrt.gguf_linear(x.float(), weight.packed, 300, 32, weight.int8_rows)
    )


@needs_dense_copy
def test_dense_copies_are_made_for_all_packed_weights_or_none():
    from radixrt.loader.quantize import keep_dense_copies

    model = torch.nn.Sequential(
        GGUFWeight(quantize(_weights(64, 64), "int4"), "int4", 64),
        GGUFWeight(quantize(_weights(32, 64), "int8"), "int8", 64),
    )
    need = 2 * (64 * 64 + 32 * 64)  # bytes of both bf16 copies
    assert keep_dense_copies(model, (need - 1) / 2**30) == 0
    assert all(w.dense is None for w in model)
    assert keep_dense_copies(model, 0) == 0
    assert keep_dense_copies(model, need / 2**30) == 2
    assert all(w.dense is not None for w in model)


def test_a_negative_dense_copy_budget_is_refused_by_name():
    from radixrt.server_args import ServerArgs

    with pytest.raises(ValueError, match="cpu_dense_copy_gb must be >= 0, got -1"):
        ServerArgs(cpu_dense_copy_gb=-1)
