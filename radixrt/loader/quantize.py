"""--quantization: which weights stay in GGUF blocks (radixrt/layers/quantized.py) that the
CPU matmul reads as stored, instead of dense floats.

- auto: a GGUF file's tensors in every block type the kernels read (layers/gguf_blocks.py:
  the K-quants, the legacy types, IQ4), the token embedding included, on the CPU at one rank;
  they are packed before the weights load, so they are never dequantized. F16/F32 tensors,
  safetensors checkpoints and CUDA stay dense.
- none: dense everywhere (every weight dequantized to the dtype: the reference).
- int4 / int8: every linear layer and the LM head, from the file's blocks where they are
  already Q4_0/Q4_1 or Q8_0, else quantized after loading from the float weights (Q4_1,
  Q8_0). The token embedding stays dense there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from radixrt.layers.embedding import LMHead, VocabParallelEmbedding
from radixrt.layers.gguf_blocks import BLOCK_TYPES
from radixrt.layers.linear import MergedLinear, PackableLinear
from radixrt.layers.quantized import (
    BLOCK,
    LOOKUP_FROM_TILES_TYPES,
    TILED_TYPES,
    GGUFWeight,
    can_keep_dense,
    quantize,
)
from radixrt.layers.sharding import CheckpointTensor
from radixrt.server_args import DENSE_COPY_DTYPES, QUANTIZATIONS

logger = logging.getLogger("radixrt.loader")

# The file types --quantization keeps as stored.
_FILE_TYPES = {"auto": frozenset(BLOCK_TYPES), "int4": {"Q4_0", "Q4_1"}, "int8": {"Q8_0"}}


class Checkpoint(Protocol):
    """Where the weights come from: a GGUF file (GGUFCheckpoint, which also has
    `packed_blocks`) or a model folder."""

    def weights(self, skip: frozenset[str]) -> Iterator[tuple[str, CheckpointTensor]]: ...


def pack_file_weights(
    model: nn.Module,
    method: str,
    path: Path,
    checkpoint: Checkpoint,
    device: torch.device,
    tp_size: int,
) -> frozenset[str]:
    """Before the weights load: give each linear layer, the LM head and (auto) the token
    embedding whose tensors the file stores in block types the kernels read (auto: any of
    gguf_blocks.BLOCK_TYPES; int4 / int8: Q4_0, Q4_1 / Q8_0) those blocks as they are, so that
    they are never dequantized. Returns the checkpoint names so packed, for the load to skip.

    ValueError naming --quantization for an unknown method, or int4/int8 off the CPU.
    """
    if method not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {method!r}")
    if method in ("int4", "int8") and device.type != "cpu":
        raise ValueError(f"--quantization {method} runs on the CPU only; use auto or none")
    # A rank of a tensor-parallel group holds slices: it quantizes those after loading.
    packed_blocks = getattr(checkpoint, "packed_blocks", None)
    if not packs_weights(method, path, device, tp_size) or tp_size > 1 or packed_blocks is None:
        return frozenset()
    file_blocks = packed_blocks()
    usable = {n: b for n, b in file_blocks.items() if b[0] in _FILE_TYPES[method]}
    counts: dict[str, int] = {}
    done: set[str] = set()
    shared: dict[str, GGUFWeight] = {}  # a tied LM head reads the embedding's blocks
    prefixes = {id(m): p for p, m in model.named_modules()}
    for module, names in _packable(model, embedding=method == "auto"):
        stacked = f"{prefixes[id(module)]}.weight"  # Phi-3's files: attn_qkv, ffn_up stacked
        if isinstance(module, MergedLinear) and stacked in usable:
            names = [stacked]
        if not all(n in usable for n in names):
            continue
        key = "+".join(names)
        packed = shared.get(key) or GGUFWeight.merged([usable[n] for n in names])
        shared[key] = packed
        _pack(module, packed)
        done.update(names)
        counts[packed.fmt] = counts.get(packed.fmt, 0) + 1
    if counts:
        logger.info("kept packed as stored (%s): %s", method, _describe(counts))
    return frozenset(done)


def apply_quantization(model: nn.Module, method: str) -> dict[str, int]:
    """After the weights load: with int4 / int8, quantize every linear layer and the LM head
    that `pack_file_weights` left dense; returns {format: layers packed}."""
    if method not in ("int4", "int8"):
        return {}
    counts: dict[str, int] = {}
    for module, names in _packable(model, embedding=False):
        dense = _dense_weight(model, module)
        if dense is None:
            continue
        if dense.shape[1] % BLOCK:
            logger.info("not quantized (in_features %d, not a multiple of %d): %s",
                        dense.shape[1], BLOCK, names)  # fmt: skip
            continue
        packed = GGUFWeight(quantize(dense, method), method, dense.shape[1])
        _pack(module, packed)
        counts[packed.fmt] = counts.get(packed.fmt, 0) + 1
    if counts:
        logger.info("quantization %s: %s", method, _describe(counts))
    return counts


def keep_dense_copies(model: nn.Module, budget_gb: float, dtype: str = "bfloat16") -> int:
    """Copies in `dtype` (bfloat16 or int8) of every packed weight for inputs of 32+ rows
    (GGUFWeight.keep_dense), made only if all of them fit in `budget_gb` GiB and the CPU
    multiplies bf16 natively; returns how many were made (all or none: one matmul path per
    step)."""
    if dtype not in DENSE_COPY_DTYPES:
        raise ValueError(
            f"cpu_dense_copy_dtype must be one of {list(DENSE_COPY_DTYPES)}, got {dtype!r}"
        )
    packed = [m for m in model.modules() if isinstance(m, GGUFWeight)]
    per_weight = 2 if dtype == "bfloat16" else 1
    need = sum(per_weight * w.in_features * w.out_features for w in packed)
    if not packed or need > budget_gb * 2**30 or not can_keep_dense():
        return 0
    for weight in packed:
        weight.keep_dense(dtype)
    logger.info(
        "dense %s copies for wide batches: %d weights, %.0f MiB", dtype, len(packed), need / 2**20
    )
    return len(packed)


def keep_int8_tiles(model: nn.Module, budget_gb: float, int8_only: bool = False) -> int:
    """The int8 kernel's tiles (GGUFWeight.keep_tiles) for the packed weights with parts of
    the TILED_TYPES; returns how many weights got them. None with a budget of 0.

    `int8_only` (int8 activations at every step, bfloat16's default): the tiles replace the
    rows of every weight that only multiplies, so they cost nothing beside the file's bytes
    and every model, however large, takes the same fast path at every row count. So do they
    for a tied embedding (lookup and LM head) of the LOOKUP_FROM_TILES_TYPES, whose lookup
    reads the tiles; one of another type keeps its rows, and gets tiles beside them only
    where they fit in `budget_gb` GiB. Otherwise (float activations on some steps) the tiles
    are a second copy, made only if they fit in `budget_gb` beside bfloat16 copies of every
    packed weight (keep_dense_copies' budget, whether or not the copies are kept), so that a
    model too big for its copies stays near its file's size (issue 33's bound: 1.5x
    llama.cpp's)."""
    if budget_gb <= 0:
        return 0
    packed = [m for m in model.modules() if isinstance(m, GGUFWeight)]
    tileable = [w for w in packed if any(t in TILED_TYPES for t in w.types)]
    lookups = {
        id(m.packed)
        for m in model.modules()
        if isinstance(m, VocabParallelEmbedding) and m.packed is not None
    }
    if int8_only:
        multiplied = {id(w) for m in model.modules() for w in _multiplied_by(m)}
        tied = [w for w in tileable if id(w) in lookups and id(w) in multiplied]
        alone = [w for w in tileable if id(w) not in lookups]
        alone += [w for w in tied if _looked_up_in_tiles(w)]
        tiled = sum(w.keep_tiles(keep_rows=False) for w in alone)
        both = [w for w in tied if not _looked_up_in_tiles(w)]
        if sum(w.packed.numel() for w in both) <= budget_gb * 2**30:
            tiled += sum(w.keep_tiles() for w in both)
        logger.info("int8 tiles (in place of the rows): %d weights", tiled)
        return tiled
    copies = sum(2 * w.in_features * w.out_features for w in packed)
    need = sum(w.packed.numel() for w in tileable)
    if not tileable or copies + need > budget_gb * 2**30:
        return 0
    tiled = sum(weight.keep_tiles() for weight in tileable)
    logger.info("int8 tiles for steps of a few rows: %d weights, <= %.0f MiB", tiled, need / 2**20)
    return tiled


def _looked_up_in_tiles(weight: GGUFWeight) -> bool:
    return all(t in LOOKUP_FROM_TILES_TYPES for t in weight.types)


def _multiplied_by(module: nn.Module) -> list[GGUFWeight]:
    """The packed weights `module` multiplies by (not an embedding's lookup table)."""
    if isinstance(module, VocabParallelEmbedding):
        return []
    return [c for c in module.children() if isinstance(c, GGUFWeight)]


def packs_weights(method: str, path: Path, device: torch.device, tp_size: int) -> bool:
    """Whether `apply_quantization` will pack linear layers: int4/int8 always (on the CPU),
    auto for a GGUF file on the CPU at one rank (its Q4/Q8 tensors)."""
    if device.type != "cpu" or method == "none":
        return False
    return method in ("int4", "int8") or (tp_size == 1 and path.suffix == ".gguf")


def _packable(model: nn.Module, embedding: bool) -> Iterator[tuple[nn.Module, list[str]]]:
    """(module, the checkpoint names of its weight in row order) for each linear layer, the LM
    head (named by the embedding's tensor when tied) and, if `embedding`, the token embedding
    (first, so that a tied head shares its packed blocks)."""
    embedding_name, embed = next(
        (name, m) for name, m in model.named_modules() if isinstance(m, VocabParallelEmbedding)
    )
    if embedding:
        yield embed, [f"{embedding_name}.weight"]
    for prefix, module in model.named_modules():
        if isinstance(module, MergedLinear):
            parent = prefix.rpartition(".")[0]
            yield module, [f"{parent}.{shard}.weight" for shard in module.shard_names]
        elif isinstance(module, PackableLinear):
            yield module, [f"{prefix}.weight"]
        elif isinstance(module, LMHead):
            tied = module.weight is None and module.packed is None
            yield module, [f"{embedding_name}.weight" if tied else f"{prefix}.weight"]


def _dense_weight(model: nn.Module, module: nn.Module) -> torch.Tensor | None:
    """A module's dense weight still to quantize (a tied LM head's is the embedding's)."""
    if isinstance(module, PackableLinear):
        return module.weight if module.packed is None else None
    assert isinstance(module, LMHead)
    if module.packed is not None:
        return None
    if module.weight is not None:
        return module.weight
    return next(m for m in model.modules() if isinstance(m, VocabParallelEmbedding)).weight


def _pack(module: nn.Module, packed: GGUFWeight) -> None:
    if isinstance(module, PackableLinear):
        module.pack(packed)
        return
    if isinstance(module, VocabParallelEmbedding):
        module.use_packed(packed)
        return
    assert isinstance(module, LMHead)
    module.packed = packed
    if module.weight is not None:
        del module.weight
        module.register_parameter("weight", None)


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} layers as {fmt}" for fmt, n in sorted(counts.items()))
