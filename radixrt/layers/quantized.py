"""Weights kept in llama.cpp's GGUF block formats, and the matmul that reads them as stored.

Two formats, blocks of 32 consecutive weights of a row (along the input features):
- int4 = Q4_1: an fp16 scale d and minimum m, then 16 bytes of 4-bit codes q (element j in the
  low nibble of byte j, element j + 16 in the high one); w = d * q + m.
- int8 = Q8_0: an fp16 scale d, then 32 int8 codes; w = d * q.
A GGUF file's Q4_1 and Q8_0 tensors are these bytes exactly (Q4_0 converts to Q4_1 without
loss); `quantize` makes them from float weights for any other checkpoint.

The matmul is native/csrc/gguf_linear.cpp when the native build is available (it computes each
block's d * sum(q * x) without writing the weights out), else plain torch: dequantize, then
F.linear (correct, and as slow as the dense layer it replaces).

`keep_dense()` adds a bfloat16 copy of the weight in oneDNN's own blocked layout, which inputs
of `COPY_FROM_ROWS` rows or more multiply instead (`dense_copy_linear`): on a CPU with AVX-512
BF16 that measured 1.16x (2,048 rows) to 1.4x (64 rows) faster than expanding the blocks per
call, and 1.3-1.8x faster than the block kernel at 12-24 rows (docs/quantization.md says how),
for 2 bytes per weight more memory (the loader's `dense_copy_gb` budget decides).
`keep_dense("int8")` keeps int8 codes per output channel instead, which those inputs multiply
as W8A8 (radixrt/native/csrc/w8a8_linear.cpp): each row of x rounded to int8 too, integer products,
0.68-0.75x the bfloat16 copy's time here.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from radixrt.layers.fused import dense_linear
from radixrt.layers.gguf_blocks import (
    BlockType,
    block_type,
    dequantize_part,
    pack,
    tiled_parts,
    unpack,
)
from radixrt.server_args import DENSE_COPY_DTYPES

BLOCK = 32  # the block of `quantize`'s two formats
PACKED = 0  # the native layer stack's kind for a packed projection (-1: dense)
# Steps of up to `int8_rows` rows round x to int8 per block and multiply in integers, as
# llama.cpp does (native/csrc/gguf_dot8.cpp); INT8_EVERY_STEP (--cpu-gguf-int8-rows -1) means
# all of them. `int8_rows_for` picks the default from the model's dtype.
INT8_EVERY_STEP = 1 << 62
INT8_ROWS = 0  # a weight made outside the loader: float32 activations
# Float inputs of at least this many rows (prefill chunks) widen tiles of the weights to
# float32 once per call (native/csrc/float_matmul.cpp) instead of each sub-block per pass of
# rows: the same sums, in the same order, at 0.4-0.7x the narrow kernel's time from 32 rows
# (a Q4_1 weight of 3,072 x 576, 2 threads, AVX2 EPYC, 2026-12-07).
DENSE_FROM_ROWS = 32
# Inputs of at least this many rows multiply a layer's dense copy where it keeps one: from 12
# rows on the copies (bf16 or int8) beat the block kernel (scripts/bench_gguf_linear.py --rows
# 4,8,12,16: level at 8 rows, 0.69-0.75x its time at 12, 0.57-0.72x at 16).
COPY_FROM_ROWS = 12
# Weights with tiles (keep_tiles) multiply in integers up to this many rows instead: there the
# tiles beat the copies (default model, AVX-512 Xeon: 8.7 against 14.8 ms a step at 12 rows,
# 16.3 against 17.0 at 24, 20.7 against 17.7 at 31; scripts/bench_gguf_linear.py).
TILED_COPY_FROM_ROWS = 24
# The block types native/csrc/gguf_tiles.cpp (and gguf_ktiles.cpp, the K-quants) lay out
# (Q4_K on AVX-512 builds only, Q6_K on AVX-512 or VNNI builds: gguf_tiles.cpp tiles_supported).
TILED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# Whose rows the embedding lookup rebuilds from the tiles (gguf_tiles.cpp's untile_row), so
# that a tied embedding of these types keeps its tiles alone.
LOOKUP_FROM_TILES_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


class GGUFWeight(nn.Module):
    """An [out_features, in_features] weight kept in GGUF blocks: one part (`blocks`, uint8
    [out, row bytes], of the type `fmt` names: a GGML name like "Q4_K", or int4 / int8) or
    several (`merged`), held as one packed tensor (`packed`, see gguf_blocks.py)."""

    packed: torch.Tensor

    def __init__(self, blocks: torch.Tensor, fmt: str, in_features: int) -> None:
        self._init([(block_type(fmt), blocks)], in_features)

    @classmethod
    def merged(cls, parts: list[tuple[str, torch.Tensor]]) -> GGUFWeight:
        """One weight of several parts (type name, uint8 rows) stacked along the output rows
        (q/k/v, gate/up); the in_features are the first part's rows' blocks."""
        types = [block_type(fmt) for fmt, _ in parts]
        in_features = parts[0][1].shape[1] // types[0].bytes * types[0].weights
        weight = cls.__new__(cls)
        typed = [(t, blocks) for t, (_, blocks) in zip(types, parts, strict=True)]
        weight._init(typed, in_features)
        return weight

    def _init(self, parts: list[tuple[BlockType, torch.Tensor]], in_features: int) -> None:
        super().__init__()
        self.register_buffer("packed", pack(parts, in_features), persistent=False)
        self.types = tuple(t.name for t, _ in parts)
        self.fmt = "+".join(dict.fromkeys(self.types))  # the distinct types, in order
        self.kind = PACKED  # the native layer stack's tag for a packed projection
        self.int8_rows = INT8_ROWS  # the loader sets --cpu-gguf-int8-rows
        self.in_features, self.out_features = in_features, sum(b.shape[0] for _, b in parts)
        # Decided here, not per call: torch.compile must not trace the loader's file checks.
        self.native = native_ops_loaded()
        self.copy_from_rows = COPY_FROM_ROWS  # TILED_COPY_FROM_ROWS once every part has tiles
        self.dense: torch.Tensor | None = None  # keep_dense(): bf16 (oneDNN's layout) or int8
        self.dense_scale: torch.Tensor | None = None  # the int8 copy's per-channel scales

    def keep_dense(self, dtype: str = "bfloat16") -> None:
        """Keep a copy for wide inputs: bfloat16 (oneDNN's reorder, hinted for 64 rows, serves
        every row count) or int8 per output channel (`quantize_channels`)."""
        if dtype not in DENSE_COPY_DTYPES:
            raise ValueError(f"dense copy dtype must be one of {DENSE_COPY_DTYPES}, got {dtype!r}")
        if dtype == "int8":
            self.dense, self.dense_scale = quantize_channels(self.dequantize())
            return
        weight = self.dequantize().bfloat16()
        self.dense = torch.ops.mkldnn._reorder_linear_weight(weight, 64)

    def keep_tiles(self, keep_rows: bool = True) -> bool:
        """Add the int8 kernel's tiles to the TILED_TYPES parts (native/csrc/gguf_tiles.cpp):
        steps of 2-16 rows multiply them in 0.5-0.98x the blocks' time, for about as many
        bytes again as those parts take, or for none without `keep_rows`: those parts then keep
        their tiles only, and the weight multiplies int8 activations only (no float kernel,
        dequantize or row lookup). A no-op without the native build or such parts. Returns
        whether it added any."""
        if not self.native:
            return False
        tiled = torch.ops.radixrt.gguf_tile.default(self.packed, keep_rows)
        if tiled.data_ptr() == self.packed.data_ptr():
            return False
        self.packed = tiled
        if all(tiled_parts(tiled)):  # not where a part keeps its blocks (Q4_K, Q6_K on AVX2)
            self.copy_from_rows = TILED_COPY_FROM_ROWS
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> x @ W.T [..., out], in x's dtype (computed in float32, except that
        the native op multiplies a bfloat16 prefill chunk in bfloat16: see gguf_linear.cpp)."""
        native_dtype = x.dtype in (torch.float32, torch.bfloat16)
        if self.dense is not None and uses_dense_copy(x, self.copy_from_rows):
            return dense_copy_linear(x, self.dense, self.dense_scale)
        if self.native and x.dim() == 2 and native_dtype and x.device.type == "cpu":
            # The common case without the reshapes and casts: ~5 dispatches per call add up
            # to a millisecond over a batch-1 step's 121 matmuls.
            return torch.ops.radixrt.gguf_linear.default(
                x, self.packed, self.out_features, DENSE_FROM_ROWS, self.int8_rows
            )
        flat = x.reshape(-1, self.in_features)
        if self.native and flat.device.type == "cpu":
            flat = flat if native_dtype else flat.float()
            y = torch.ops.radixrt.gguf_linear.default(
                flat, self.packed, self.out_features, DENSE_FROM_ROWS, self.int8_rows
            )
        else:
            y = dense_linear(flat.float(), self.dequantize().to(flat.device))
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (int64 [T]) of the weight as float32 [T, in]: an embedding lookup."""
        if self.native:
            return torch.ops.radixrt.gguf_rows.default(self.packed, ids, self.in_features)  # type: ignore[no-any-return]
        return self.dequantize()[ids]

    def dequantize(self) -> torch.Tensor:
        """The weight as float32 [out, in], exactly as gguf-py dequantizes its blocks."""
        if self.native:
            return torch.ops.radixrt.gguf_dequantize.default(self.packed)  # type: ignore[no-any-return]
        in_features, parts = unpack(self.packed)
        return torch.cat([dequantize_part(t, b, in_features) for t, b in parts])

    def extra_repr(self) -> str:
        return f"{self.fmt}, in_features={self.in_features}, out_features={self.out_features}"


def uses_dense_copy(x: torch.Tensor, copy_from_rows: int) -> bool:
    """Whether a layer with a dense copy multiplies x with it (decoder_layers.cpp agrees)."""
    return (
        x.dim() == 2
        and x.shape[0] >= copy_from_rows
        and x.dtype == torch.bfloat16
        and not torch.compiler.is_compiling()
    )


def dense_copy_linear(
    x: torch.Tensor, dense: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """x W.T with a `keep_dense` copy, through the op that the layer stack calls too: oneDNN's
    bfloat16 matmul, or W8A8 for an int8 copy (its torch twin without the native build)."""
    if scale is None:
        return torch.ops.mkldnn._linear_pointwise.default(x, dense, None, "none", [], "")  # type: ignore[no-any-return]
    if native_ops_loaded():
        return torch.ops.radixrt.w8a8_linear.default(x, dense, scale)  # type: ignore[no-any-return]
    return w8a8_reference(x, dense, scale)


def quantize_channels(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float [N, K] -> (int8 codes [N, K], float32 scales [N]): per output channel,
    scale = max|w| / 127 and q = round(w * (1 / scale)), so w ~ scale * q within half a step."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127
    q = (w * _safe_inverse(scale)[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def w8a8_reference(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """radixrt::w8a8_linear in torch ops, bit for bit: each row of x rounded to int8 with
    scale max|x| / 127, exact int32 products, then acc * (x_scale * w_scale) in x's dtype."""
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True)
    # A tensor over a tensor: torch computes a scalar over a tensor as 127 * (1 / amax).
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    xq = (xf * inv).round().clamp(-127, 127).to(torch.int8)
    acc = torch._int_mm(xq, wq.t())
    return (acc.float() * (amax / 127 * w_scale)).to(x.dtype)


def int8_rows_for(setting: int | None, dtype: torch.dtype) -> int:
    """GGUFWeight.int8_rows for --cpu-gguf-int8-rows `setting` (-1: every step; None: auto).

    Auto keeps one arithmetic per weight whatever the step's row count, so that a row's result
    never depends on its batch. bfloat16: int8 activations at every step, llama.cpp's
    arithmetic (2-3x faster K-quant matmuls at batch 1, and exact integer sums whose float
    steps run in a fixed order per row: docs/determinism.md). float32: float activations, the
    products exactly the dequantized weights' (equal to transformers token for token), each
    output summed in one order at every width (native/csrc/gguf_widen.h). A
    setting from 1 up switches kernels by the row count again: faster prefill on a CPU with
    bf16 matmul units (the dense copies), and a request's bits then depend on its batch."""
    if setting is None:
        return INT8_EVERY_STEP if dtype == torch.bfloat16 else 0
    return INT8_EVERY_STEP if setting == -1 else setting


def can_keep_dense() -> bool:
    """bfloat16 oneDNN matmuls are what the copy is for: a CPU with AVX-512 BF16 or AMX."""
    from radixrt.native.cpu import cpu_has_bf16

    return torch.backends.mkldnn.is_available() and cpu_has_bf16()


@functools.cache
def native_ops_loaded() -> bool:
    """Whether radixrt's compiled CPU ops are registered (radixrt.native.build loads them)."""
    from radixrt.native.build import load_native

    if load_native() is None:
        return False
    _register_fakes()
    return True


def _register_fakes() -> None:
    # Output shapes without running the kernels: what torch.compile traces the ops with.
    @torch.library.register_fake("radixrt::gguf_linear")
    def _(x: torch.Tensor, packed: torch.Tensor, out: int, dense: int, int8: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], out)

    @torch.library.register_fake("radixrt::gguf_rows")
    def _(packed: torch.Tensor, ids: torch.Tensor, in_features: int) -> torch.Tensor:
        return packed.new_empty(ids.shape[0], in_features, dtype=torch.float32)

    @torch.library.register_fake("radixrt::w8a8_linear")
    def _(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], wq.shape[0])


def quantize(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """Float weight [N, K] (K a multiple of 32) -> GGUF blocks uint8 [N, K / 32 * bytes].

    int4 (Q4_1): per block, d = (max - min) / 15 and m = min, both rounded to fp16 first, then
    q = round((w - m) / d) in 0..15. int8 (Q8_0): d = max|w| / 127 (fp16), q = round(w / d).
    """
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"quantization needs in_features divisible by {BLOCK}, got {k}")
    w = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    if fmt == "int4":
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        d, m = ((hi - lo) / 15).half(), lo.half()
        inv = _safe_inverse(d.float())
        q = ((w - m.float()) * inv).round().clamp(0, 15).to(torch.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)
        out = torch.cat([_half_bytes(d), _half_bytes(m), packed], dim=-1)
    elif fmt == "int8":
        d = (w.abs().amax(-1, keepdim=True) / 127).half()
        q = (w * _safe_inverse(d.float())).round().clamp(-127, 127).to(torch.int8)
        out = torch.cat([_half_bytes(d), q.view(torch.uint8)], dim=-1)
    else:
        raise ValueError(f"quantization format must be one of ['int4', 'int8'], got {fmt!r}")
    return out.reshape(n, -1).contiguous()


def _half_bytes(values: torch.Tensor) -> torch.Tensor:
    """[..., 1] float16 -> [..., 2] uint8."""
    return values.contiguous().view(torch.uint8)


def _safe_inverse(d: torch.Tensor) -> torch.Tensor:
    # A block of equal weights has d = 0: its codes are 0 and its value is m (or 0).
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
