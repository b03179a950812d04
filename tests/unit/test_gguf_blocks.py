"""Every GGUF block type the kernels multiply as stored (radixrt/layers/gguf_blocks.py,
radixrt/native/csrc/gguf_linear.cpp): dequantization bit for bit against gguf-py's, on random
blocks with zero and extreme scales and on a real file's tensors; each matmul against float64
on the dequantized weights; merged weights of several types; the int8 kernel's tiles; and the
AVX2 paths of a CPU with AVX-512, through RADIXRT_CPU_ISA=avx2 in a child process."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from radixrt.layers.gguf_blocks import BLOCK_TYPES, block_type, dequantize_part
from radixrt.layers.quantized import (
    COPY_FROM_ROWS,
    DENSE_FROM_ROWS,
    INT8_EVERY_STEP,
    LOOKUP_FROM_TILES_TYPES,
    TILED_COPY_FROM_ROWS,
    TILED_TYPES,
    GGUFWeight,
)
from radixrt.native.build import load_native
from radixrt.native.cpu import ISA_ENV, cpu_flags, forced_isa

needs_native = pytest.mark.skipif(
    load_native() is None, reason="radixrt's native CPU ops did not build (no compiler?)"
)
TYPES = sorted(BLOCK_TYPES)
# Byte offsets of each type's fp16 fields (scales d, minimums dmin / m) within a block.
HALVES = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_XS": [0],
}  # fmt: skip
# A float32 dot product of K terms, summed in any order, is within K * 2^-24 * sum |x_j w_j|
# of the exact one (each product and each partial sum rounds once, relative 2^-24 at most).
UNIT = 2.0**-24


def random_blocks(name: str, rows: int, in_features: int, seed: int) -> torch.Tensor:
    """Random codes and scales of type `name`: fp16 fields normal at 0.01, with a zero, the
    largest fp16 (65504), a negative one and a subnormal among them."""
    t = BLOCK_TYPES[name]
    g = np.random.default_rng(seed)
    nb = in_features // t.weights
    b = g.integers(0, 256, size=(rows, nb, t.bytes), dtype=np.uint8)
    for offset in HALVES[name]:
        h = (g.standard_normal((rows, nb)) * 0.01).astype(np.float16)
        h.reshape(-1)[:4] = [0.0, 65504.0, -3.5, 6e-8]
        b[:, :, offset : offset + 2] = h.view(np.uint8).reshape(rows, nb, 2)
    return torch.from_numpy(b.reshape(rows, -1).copy())


def avx512_kernels() -> bool:
    """Whether the native kernels here are built for AVX-512 (not AVX2: RADIXRT_CPU_ISA)."""
    return forced_isa() != "avx2" and {"avx512f", "avx512bw"} <= cpu_flags()


def types_keeping_blocks() -> set[str]:
    """The tiled types whose tiles lost to their blocks at one row on this build (gguf_tiles.cpp
    tiles_supported): none with AVX-512; Q4_K on AVX2; Q6_K too without (AVX-)VNNI."""
    if avx512_kernels():
        return set()
    return {"Q4_K"} | (set() if "avx_vnni" in cpu_flags() else {"Q6_K"})


def dot_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The float32 rounding bound of x @ w.T, per output (see UNIT)."""
    return x.shape[1] * UNIT * (x.double().abs() @ w.double().abs().T)


def int8_bound(x: torch.Tensor, w: torch.Tensor, group: int) -> torch.Tensor:
    """The int8 kernel's bound: x is rounded to int8 per block of `group` inputs, step
    max|x| / 127, so each x_j moves by at most half a step and the product by that times the
    block's |w_j|; the integer sums are exact and the float steps (one per block) are within
    the float32 bound, doubled for x's rounded values."""
    rows, k = x.shape
    half_step = x.abs().reshape(rows, k // group, group).amax(-1).double() / 254
    w_abs = w.double().abs().reshape(w.shape[0], k // group, group).sum(-1)
    return half_step @ w_abs.T + 2 * dot_bound(x, w)


@needs_native
@pytest.mark.parametrize("name", TYPES)
def test_native_dequantization_is_gguf_pys_bit_for_bit(name):
    blocks = random_blocks(name, 37, 512, seed=1)
    reference = dequantize_part(BLOCK_TYPES[name], blocks, 512)
    weight = GGUFWeight(blocks, name, 512)
    assert torch.equal(weight.dequantize(), reference)
    ids = torch.tensor([36, 0, 5, 5])
    assert torch.equal(weight.rows(ids), reference[ids])


@needs_native
def test_a_real_files_tensors_dequantize_as_gguf_py_reads_them():
    from radixrt.loader.default_model import default_model_path
    from radixrt.loader.gguf_loader import GGUFCheckpoint

    blocks = GGUFCheckpoint(default_model_path()).packed_blocks()
    for name in ("model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"):
        fmt, rows = blocks[name]
        in_features = rows.shape[1] // BLOCK_TYPES[fmt].bytes * BLOCK_TYPES[fmt].weights
        reference = dequantize_part(BLOCK_TYPES[fmt], rows, in_features)
        assert torch.equal(GGUFWeight(rows, fmt, in_features).dequantize(), reference), name


@needs_native
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, DENSE_FROM_ROWS, 70])
def test_each_float_matmul_is_within_float32_rounding_of_float64(name, rows):
    # With float32 activations (int8_rows 0): 1-31 rows the sub-block kernel, several input
    # rows per pass; from DENSE_FROM_ROWS on, tiles expanded for oneDNN. Outputs of both signs
    # cancel, hence the per-output bound on the sum of |products|, not one relative to y.
    blocks = random_blocks(name, 45, 768, seed=rows)
    weight = GGUFWeight(blocks, name, 768)
    weight.int8_rows = 0  # --cpu-gguf-int8-rows 0: float32 activations
    w = dequantize_part(BLOCK_TYPES[name], blocks, 768)
    x = torch.randn(rows, 768, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        y = weight(x)
    exact = x.double() @ w.double().T
    assert y.shape == (rows, 45) and y.dtype == torch.float32
    assert bool(((y.double() - exact).abs() <= dot_bound(x, w)).all())


@needs_native
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 70])
def test_each_int8_matmul_is_within_its_activation_rounding(name, rows):
    # x rounded to int8 per 32 (per 256 for the K-quants), here at every row count.
    # 1,280 inputs: five groups of eight 32-weight blocks; 1,792: six and a group of four.
    t = BLOCK_TYPES[name]
    k = 1792 if rows % 2 else 1280
    blocks = random_blocks(name, 45, k, seed=rows)
    weight = GGUFWeight(blocks, name, k)
    weight.int8_rows = INT8_EVERY_STEP  # --cpu-gguf-int8-rows -1
    w = dequantize_part(t, blocks, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    x[0, 5] = 40.0  # an outlier: its block's step is large
    with torch.inference_mode():
        y = weight(x)
    error = (y.double() - x.double() @ w.double().T).abs()
    assert bool((error <= int8_bound(x, w, t.weights)).all())
    # Not the float kernel's result: the int8 rounding shows (a test that can fail).
    weight.int8_rows = 0
    assert not torch.equal(y, weight(x))


@needs_native
@pytest.mark.parametrize("tiles", [False, True])
@pytest.mark.parametrize("name", TYPES)
def test_an_int8_rows_result_does_not_depend_on_its_batch(name, tiles):
    # Every row count runs the same per-row arithmetic (rows never mix; a row pass of 1-8 rows
    # and a tile of columns change only the order of independent work), so a request's
    # tokens are the same alone or in any batch of 1-64 rows, on 1 or 2 threads, from the
    # blocks or (where the type has them) from tiles that replace the rows. 576 inputs: two
    # groups of eight 32-weight blocks and a group of two (768 for the 256-weight types).
    k = 576 if BLOCK_TYPES[name].weights == 32 else 768
    weight = GGUFWeight(random_blocks(name, 50, k, seed=8), name, k)
    weight.int8_rows = INT8_EVERY_STEP
    if tiles:
        weight.keep_tiles(keep_rows=False)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(9))
    assert_rows_do_not_depend_on_the_batch(weight, x, (2, 7, 8, 9, 31, 33))
    with torch.inference_mode():
        xb = x.bfloat16()  # bfloat16 activations take the same path, widened first
        singles = torch.cat([weight(xb[i : i + 1]) for i in (0, 20, 63)])
        assert torch.equal(weight(xb)[[0, 20, 63]], singles)
        # Read as bfloat16 and rounded to it in the kernel: the float32 path's bits, rounded.
        assert torch.equal(weight(xb), weight(xb.float()).bfloat16())


def assert_rows_do_not_depend_on_the_batch(weight: GGUFWeight, x: torch.Tensor, slices) -> None:
    """weight(x) row by row equals it for all of x at once, on 1 and 2 threads, and for the
    slices of `slices` rows from row 3."""
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            batch = weight(x)
            for count in (1, 2):
                torch.set_num_threads(count)
                alone = torch.cat([weight(x[i : i + 1]) for i in range(x.shape[0])])
                assert torch.equal(batch, alone), f"{count} threads"
                for rows in slices:
                    assert torch.equal(weight(x[3 : 3 + rows]), batch[3 : 3 + rows]), rows
    finally:
        torch.set_num_threads(threads)


@needs_native
@pytest.mark.parametrize("name", TYPES)
def test_a_float_rows_result_does_not_depend_on_its_batch(name):
    # Float32 activations: the narrow kernel (under DENSE_FROM_ROWS rows, sub-blocks widened
    # in registers) and the wide one (tiles widened once) sum each output in one order, so a
    # row's bits are the same alone, in any batch of 1-70 rows, on 1 or 2 threads. 50 weight
    # rows: neither kernel's column group (3, 6, 8) divides it. oneDNN's matmul, which the wide
    # steps ran before, failed this.
    k = 576 if BLOCK_TYPES[name].weights == 32 else 768
    blocks = random_blocks(name, 50, k, seed=10)
    weight = GGUFWeight(blocks, name, k)
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(11))
    assert_rows_do_not_depend_on_the_batch(weight, x, (2, 5, 8, 31, 32, 33, 45))
    with torch.inference_mode():
        batch = weight(x)
    w = dequantize_part(BLOCK_TYPES[name], blocks, k)
    assert bool(((batch.double() - x.double() @ w.double().T).abs() <= dot_bound(x, w)).all())


@needs_native
@pytest.mark.parametrize("rows", [1, 4, 40])
def test_bfloat16_inputs_are_within_bfloat16s_rounding(rows):
    # Narrow: x (exact in float32) times the weights in float32, then one rounding of y to
    # bf16 (2^-9 relative). Wide: the expanded weights rounded to bf16 too (2^-9 each) before
    # a float32-accumulated matmul. Either way within (2^-8 + K u) sum |x w|.
    blocks = random_blocks("Q4_K", 40, 512, seed=3)
    w = dequantize_part(BLOCK_TYPES["Q4_K"], blocks, 512)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(4)).bfloat16()
    with torch.inference_mode():
        y = GGUFWeight(blocks, "Q4_K", 512)(x)
    assert y.dtype == torch.bfloat16
    exact = x.double() @ w.double().T
    bound = 2.0**-8 * (x.double().abs() @ w.double().abs().T) + dot_bound(x.float(), w)
    assert bool(((y.double() - exact).abs() <= bound).all())


@needs_native
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_a_merged_weight_of_several_types_is_its_parts_side_by_side(rows):
    # Q4_K_M files store a layer's q and k in Q4_K and its v in Q6_K: one packed weight.
    names = ["Q4_K", "Q6_K", "Q8_0"]
    parts = [
        (n, random_blocks(n, r, 512, seed=i))
        for i, (n, r) in enumerate(zip(names, [16, 8, 24], strict=True))
    ]
    merged = GGUFWeight.merged(parts)
    assert merged.fmt == "Q4_K+Q6_K+Q8_0" and merged.out_features == 48
    w = torch.cat([dequantize_part(BLOCK_TYPES[n], b, 512) for n, b in parts])
    assert torch.equal(merged.dequantize(), w)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(5))
    alone = [GGUFWeight(b, n, 512) for n, b in parts]
    with torch.inference_mode():
        # The same kernel per part, column by column: int8 at any row count, float below
        # DENSE_FROM_ROWS (from there oneDNN's tiles, whose sums may group differently).
        for int8_rows in (INT8_EVERY_STEP, 0):
            for weight in (merged, *alone):
                weight.int8_rows = int8_rows
            if int8_rows or rows < DENSE_FROM_ROWS:
                assert torch.equal(merged(x), torch.cat([a(x) for a in alone], dim=1))
        y = merged(x)  # float32 activations
    assert bool(((y.double() - x.double() @ w.double().T).abs() <= dot_bound(x, w)).all())


@needs_native
@pytest.mark.parametrize("name", TILED_TYPES)
@pytest.mark.parametrize("k", [576, 1792])
def test_tiles_multiply_within_the_int8_bound_whatever_the_batch(name, k):
    # 45 columns: two whole tiles of 16 and a partial one; 576 inputs: 18 blocks of 32, or two
    # super-blocks of 256 (512) for the K-quants, whose x is rounded per 256.
    group = BLOCK_TYPES[name].weights
    k -= k % group
    blocks = random_blocks(name, 45, k, seed=k)
    weight = GGUFWeight(blocks, name, k)
    weight.int8_rows = INT8_EVERY_STEP
    x = torch.randn(19, k, generator=torch.Generator().manual_seed(k))
    x[0, 5] = 40.0
    with torch.inference_mode():
        plain = weight(x)
        before = weight.packed
        weight.keep_tiles()
        if name in types_keeping_blocks():  # slower than their blocks there
            assert weight.packed is before and weight.copy_from_rows == COPY_FROM_ROWS
            return
        assert weight.copy_from_rows == TILED_COPY_FROM_ROWS
        tiled = weight(x)
        alone = torch.cat([weight(x[i : i + 1]) for i in range(19)])
    w = dequantize_part(BLOCK_TYPES[name], blocks, k)
    assert torch.equal(tiled, alone)  # a row's result does not depend on its batch
    error = (tiled.double() - x.double() @ w.double().T).abs()
    assert bool((error <= int8_bound(x, w, group)).all())
    # The same integer sums as the block kernel, added up per column instead of eight lanes at
    # a time: equal up to float32 rounding, but not bit for bit.
    assert not torch.equal(tiled, plain)
    # Each within the float32 bound of the same sum (doubled for x rounded), so apart by twice it.
    assert bool(((tiled - plain).abs() <= dot_bound(x, w).float() * 4).all())
    # The rows stay: dequantization and embedding lookups read them as before.
    assert torch.equal(weight.dequantize(), w)
    assert torch.equal(weight.rows(torch.tensor([44, 0])), w[[44, 0]])


@needs_native
@pytest.mark.parametrize("rows", [3, 12])
def test_a_merged_weight_tiles_only_the_parts_it_can(rows):
    parts = [
        (n, random_blocks(n, r, 512, seed=r)) for n, r in [("Q4_1", 20), ("Q3_K", 8), ("Q6_K", 24)]
    ]
    merged = GGUFWeight.merged(parts)
    alone = [GGUFWeight(b, n, 512) for n, b in parts]
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    before = merged.packed
    for weight in (merged, *alone):
        weight.int8_rows = INT8_EVERY_STEP
        weight.keep_tiles()
    assert merged.packed.data_ptr() != before.data_ptr()
    assert merged.copy_from_rows == COPY_FROM_ROWS  # its Q3_K part multiplies blocks
    untiled = alone[1].packed
    alone[1].keep_tiles()
    assert alone[1].packed is untiled  # nothing to tile: the same tensor
    with torch.inference_mode():
        assert torch.equal(merged(x), torch.cat([a(x) for a in alone], dim=1))


def test_the_torch_fallback_reads_every_type(monkeypatch):
    from radixrt.layers import quantized

    monkeypatch.setattr(quantized, "native_ops_loaded", lambda: False)
    for name in ("Q4_K", "IQ4_XS", "Q5_1"):
        blocks = random_blocks(name, 8, 256, seed=6)
        weight = GGUFWeight(blocks, name, 256)
        w = dequantize_part(BLOCK_TYPES[name], blocks, 256)
        x = torch.randn(2, 256)
        assert bool(
            ((weight(x).double() - x.double() @ w.double().T).abs() <= dot_bound(x, w)).all()
        )
        assert torch.equal(weight.rows(torch.tensor([7, 1])), w[[7, 1]])


def test_bad_types_and_widths_are_refused_by_name():
    with pytest.raises(ValueError, match=r"GGUF block type must be one of \['IQ4_NL'"):
        block_type("Q1_0")
    with pytest.raises(ValueError, match="Q4_K needs in_features divisible by 256, got 576"):
        GGUFWeight(torch.zeros(2, 324, dtype=torch.uint8), "Q4_K", 576)


def test_the_forced_instruction_set_is_checked_by_name(monkeypatch):
    monkeypatch.setenv(ISA_ENV, "avx9000")
    with pytest.raises(ValueError, match=r"RADIXRT_CPU_ISA must be one of \['native', 'avx2'\]"):
        forced_isa()


@pytest.mark.slow
@needs_native
@pytest.mark.skipif(
    "avx512f" not in cpu_flags() or forced_isa() == "avx2",
    reason="this CPU has no AVX-512: the tests above already ran its AVX2 paths",
)
def test_the_avx2_paths_pass_the_same_tests_on_an_avx512_cpu():
    # A second build of the kernels (cached like the first) with -mno-avx512f.
    env = {**os.environ, ISA_ENV: "avx2"}
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
         "-k", "not avx2_paths", "-m", "not gpu"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
    assert " passed" in child.stdout


@needs_native
@pytest.mark.parametrize("name", TYPES)
def test_a_lookup_reads_the_same_rows_from_tiles_alone(name):
    # A tied embedding of the LOOKUP_FROM_TILES_TYPES keeps only its tiles: each looked-up
    # row's blocks are rebuilt from them, so the floats are the blocks' own. 50 rows: the
    # last tile is part empty. Other types refuse the lookup, naming why.
    k = 576 if BLOCK_TYPES[name].weights == 32 else 768
    weight = GGUFWeight(random_blocks(name, 50, k, seed=11), name, k)
    ids = torch.tensor([0, 15, 16, 31, 49, 7, 49, 32])
    want = weight.rows(ids)
    if not weight.keep_tiles(keep_rows=False):
        pytest.skip(f"{name} has no tiles in this build")
    if name not in LOOKUP_FROM_TILES_TYPES:
        with pytest.raises(RuntimeError, match="only its int8 tiles"):
            weight.rows(ids)
        return
    assert torch.equal(weight.rows(ids), want)
    assert torch.equal(
        weight.rows(torch.arange(50)),
        GGUFWeight(random_blocks(name, 50, k, seed=11), name, k).dequantize(),
    )
