"""A GGUF file read without torch: its header (the HTTP process's /model_info reads it, and
builds the tokenizer from it: read_tokenizer_metadata) and its tensors as memory-mapped views
(read_gguf, which gguf_loader.py turns into the HF config and weights).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

# GGUF value types: struct formats of the scalars, numpy dtypes of the arrays' elements.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# GGUF general.architecture -> (transformers model_type, HF architecture name).
ARCHS = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    "smollm3": ("smollm3", "SmolLM3ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
}


def check_architecture(arch: str) -> str:
    """`arch` if a GGUF general.architecture this runtime loads, else ValueError naming it and
    the supported ones."""
    if arch not in ARCHS:
        raise ValueError(
            f"GGUF general.architecture {arch!r} is not supported; supported: {sorted(ARCHS)}"
        )
    return arch


def hf_identity(path: str | Path) -> tuple[str, str]:
    """(transformers model_type, HF architecture name) of a GGUF file's model; ValueError for
    an architecture this runtime does not load."""
    return ARCHS[check_architecture(read_architecture(path))]


def read_tokenizer_metadata(path: str | Path) -> dict[str, Any]:
    """The tokenizer.* entries of a GGUF file's header: numbers, strings, lists of strings and
    numpy arrays. Only the header is read (gguf's GGUFReader parses every tensor too, 3 s for
    Gemma 3's file against 0.1 s)."""
    return read_header(path, "tokenizer.")


def read_architecture(path: str | Path) -> str:
    """general.architecture of a GGUF file, from its header alone ("" if it names none)."""
    return str(read_header(path, "general.architecture").get("general.architecture", ""))


def read_header(path: str | Path, prefix: str) -> dict[str, Any]:
    """The header's entries whose keys start with `prefix`."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _entries(buf, str(path), prefix)[0]


def _entries(buf: Any, path: str, prefix: str) -> tuple[dict[str, Any], int, int]:
    """(the entries whose keys start with prefix, the tensor count, where the tensor infos
    start)."""
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError(f"{path} is not a little-endian GGUF file of version 2 or 3")
    pos, found = 24, {}
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        (kind,) = struct.unpack_from("<I", buf, pos)
        value, pos = _value(buf, pos + 4, kind)
        if key.startswith(prefix):
            found[key] = value
    return found, n_tensors, pos


class GGUFTensor(NamedTuple):
    """One tensor as gguf's GGUFReader describes it: `shape` innermost first, `data` a
    read-only view of the file in gguf's layout (elements for float types, else rows of
    bytes), which gguf.quants.dequantize takes."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray
    data: np.ndarray


def read_gguf(path: str | Path) -> tuple[dict[str, Any], list[GGUFTensor]]:
    """Every header entry and every tensor of a GGUF file, memory-mapped. The header is parsed
    here, not by gguf's GGUFReader, which splits every vocabulary string into numpy parts:
    3.3 s for Gemma 3's 262k tokens, against 0.2 s."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        meta, n_tensors, pos = _entries(buf, str(path), "")
        infos = []
        for _ in range(n_tensors):
            name, pos = _string(buf, pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = np.array(struct.unpack_from(f"<{n_dims}Q", buf, pos + 4), dtype=np.uint64)
            kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            infos.append((name, dims, GGMLQuantizationType(kind), offset))
            pos += 4 + 8 * n_dims + 12
    data = np.memmap(path, mode="r").view(np.ndarray)  # shares the read-only mapping
    alignment = int(meta.get("general.alignment", 32))
    start = (pos + alignment - 1) // alignment * alignment
    tensors = []
    for name, dims, kind, offset in infos:
        shape = tuple(int(d) for d in reversed(dims))  # outermost first, as numpy has it
        block, size = GGML_QUANT_SIZES[kind]
        elements = int(np.prod(shape))
        raw = data[start + offset : start + offset + elements // block * size]
        if kind.name in _ELEMENT_TYPES:
            array = raw.view(_ELEMENT_TYPES[kind.name]).reshape(shape)
        else:  # rows of blocks, as bytes
            array = raw.reshape(*shape[:-1], shape[-1] // block * size)
        tensors.append(GGUFTensor(name, kind, dims, array))
    return meta, tensors


_ELEMENT_TYPES = {
    "F32": np.float32, "F16": np.float16, "F64": np.float64,
    "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
}  # fmt: skip


def _string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (size,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8 : pos + 8 + size].decode(), pos + 8 + size


def _value(buf: mmap.mmap, pos: int, kind: int) -> tuple[Any, int]:
    if kind == _STRING:
        return _string(buf, pos)
    if kind != _ARRAY:
        scalar = struct.Struct(_SCALARS[kind])
        return scalar.unpack_from(buf, pos)[0], pos + scalar.size
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item == _STRING:
        return _strings(buf, pos, count)
    dtype = np.dtype(_SCALARS[item].replace("?", "u1"))
    return np.frombuffer(buf, dtype, count, pos).copy(), pos + count * dtype.itemsize


def _strings(buf: mmap.mmap, pos: int, count: int) -> tuple[list[str], int]:
    out, size_at = [], struct.Struct("<Q").unpack_from
    for _ in range(count):
        (size,) = size_at(buf, pos)
        out.append(buf[pos + 8 : pos + 8 + size].decode())
        pos += 8 + size
    return out, pos
