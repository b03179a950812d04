"""llama.cpp's GGUF block types as radixrt keeps them: the table of supported types, the packed
tensor the native matmul reads (radixrt/native/csrc/gguf_linear.cpp), and gguf-py's
dequantization as the reference and the fallback without the native build.

A packed weight is one uint8 tensor: a header of int64s
    [MAGIC, in_features, out_features, parts, then per part: type id, rows, byte offset,
     bytes per row]
padded to 64 bytes, then each part's rows as the file stores them. A merged projection whose
pieces the file holds in different types (Q4_K_M keeps q and k in Q4_K, v in Q6_K in some
layers) is one weight of several parts, so it stays one matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MAGIC = 0x57515852  # "RXQW", checked by the kernel
TILED_MAGIC = 0x54515852  # "RXQT": native/csrc/gguf_layout.cpp's gguf_tile appended tiles
_HEADER_FIELDS, _PART_FIELDS, _ALIGN = 4, 4, 64


@dataclass(frozen=True)
class BlockType:
    name: str
    type_id: int  # ggml's GGMLQuantizationType
    weights: int  # per block
    bytes: int  # per block


# Every type the kernels multiply as stored: the ones llama.cpp's common file types hold.
BLOCK_TYPES = {
    t.name: t
    for t in (
        BlockType("Q4_0", 2, 32, 18),
        BlockType("Q4_1", 3, 32, 20),
        BlockType("Q5_0", 6, 32, 22),
        BlockType("Q5_1", 7, 32, 24),
        BlockType("Q8_0", 8, 32, 34),
        BlockType("Q2_K", 10, 256, 84),
        BlockType("Q3_K", 11, 256, 110),
        BlockType("Q4_K", 12, 256, 144),
        BlockType("Q5_K", 13, 256, 176),
        BlockType("Q6_K", 14, 256, 210),
        BlockType("IQ4_NL", 20, 32, 18),
        BlockType("IQ4_XS", 23, 256, 136),
    )
}
BY_ID = {t.type_id: t for t in BLOCK_TYPES.values()}
# --quantization int4 / int8 quantize to these two (layers/quantized.py's `quantize`).
ALIASES = {"int4": "Q4_1", "int8": "Q8_0"}


def block_type(name: str) -> BlockType:
    """The type named `name` (a GGML name or an alias); ValueError listing the supported."""
    t = BLOCK_TYPES.get(ALIASES.get(name, name))
    if t is None:
        raise ValueError(
            f"GGUF block type must be one of {sorted(BLOCK_TYPES)} (or {sorted(ALIASES)}), "
            f"got {name!r}"
        )
    return t


def row_bytes(t: BlockType, in_features: int) -> int:
    """Bytes of one row of `in_features` weights; ValueError if they are not whole blocks."""
    if in_features % t.weights:
        raise ValueError(f"{t.name} needs in_features divisible by {t.weights}, got {in_features}")
    return in_features // t.weights * t.bytes


def pack(parts: list[tuple[BlockType, torch.Tensor]], in_features: int) -> torch.Tensor:
    """The packed tensor of `parts` (each: type and uint8 rows [rows, row bytes]), stacked
    along the output rows in order."""
    header_bytes = 8 * (_HEADER_FIELDS + _PART_FIELDS * len(parts))
    offset = -(-header_bytes // _ALIGN) * _ALIGN
    fields = [MAGIC, in_features, sum(b.shape[0] for _, b in parts), len(parts)]
    for t, blocks in parts:
        width = row_bytes(t, in_features)
        if blocks.dim() != 2 or blocks.shape[1] != width or blocks.dtype != torch.uint8:
            raise ValueError(
                f"{t.name} rows of shape {tuple(blocks.shape)} do not hold {in_features} inputs"
            )
        fields += [t.type_id, blocks.shape[0], offset, width]
        offset += -(-blocks.numel() // _ALIGN) * _ALIGN
    packed = torch.zeros(offset, dtype=torch.uint8)
    packed[: 8 * len(fields)] = torch.tensor(fields, dtype=torch.int64).view(torch.uint8)
    for (_, blocks), start in zip(parts, fields[_HEADER_FIELDS + 2 :: _PART_FIELDS], strict=True):
        packed[start : start + blocks.numel()] = blocks.reshape(-1)
    return packed


def unpack(packed: torch.Tensor) -> tuple[int, list[tuple[BlockType, torch.Tensor]]]:
    """(in_features, parts) of a packed tensor; the parts are views into it. ValueError for a
    weight whose parts kept only their int8 tiles (GGUFWeight.keep_tiles without rows)."""
    head = packed[: 8 * _HEADER_FIELDS].view(torch.int64).tolist()
    in_features, parts = head[1], head[3]
    table = packed[8 * _HEADER_FIELDS : 8 * (_HEADER_FIELDS + _PART_FIELDS * parts)]
    out = []
    for type_id, rows, start, width in table.view(torch.int64).reshape(parts, 4).tolist():
        if start < 0:
            raise ValueError("this packed weight keeps only its int8 tiles, not its rows")
        out.append((BY_ID[type_id], packed[start : start + rows * width].view(rows, width)))
    return in_features, out


def tiled_parts(packed: torch.Tensor) -> list[bool]:
    """Which parts of a packed tensor have the int8 kernel's tiles: a tiled header ends its
    part table with one tile offset per part, 0 where that part has none."""
    head = packed[: 8 * _HEADER_FIELDS].view(torch.int64).tolist()
    parts = head[3]
    if head[0] != TILED_MAGIC:
        return [False] * parts
    table_end = _HEADER_FIELDS + _PART_FIELDS * parts
    offsets = packed[8 * table_end : 8 * (table_end + parts)].view(torch.int64)
    return [bool(o) for o in offsets.tolist()]


def dequantize_part(t: BlockType, blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """uint8 rows of type `t` -> float32 [rows, in_features], by gguf-py (llama.cpp's Python
    package): the reference the kernels equal bit for bit."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    array = dequantize(np.ascontiguousarray(blocks.numpy()), GGMLQuantizationType(t.type_id))
    return torch.from_numpy(np.asarray(array, dtype=np.float32)).reshape(-1, in_features)
