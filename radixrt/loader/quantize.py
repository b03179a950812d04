"""--quantization: after loading, swap the dense weights of the linear layers and the LM head
for GGUF blocks (radixrt/layers/quantized.py) that the CPU matmul reads as stored.

- auto: a GGUF file's own Q4_0/Q4_1 (int4) and Q8_0 (int8) tensors, on the CPU at one rank;
  anything else (F16/F32 or K-quant tensors, safetensors checkpoints, CUDA) stays dense.
- none: dense everywhere (every weight dequantized to the dtype: the reference).
- int4 / int8: every linear layer and the LM head, from the file's blocks where they are
  already in that format, else quantized here from the loaded float weights.
The token embedding stays dense: a lookup reads one row per token.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig

from radixrt.layers.embedding import LMHead, VocabParallelEmbedding
from radixrt.layers.linear import MergedLinear, PackableLinear
from radixrt.layers.quantized import BLOCK, GGUFWeight, can_keep_dense, quantize
from radixrt.server_args import DENSE_COPY_DTYPES, QUANTIZATIONS

logger = logging.getLogger("radixrt.loader")

Blocks = dict[str, tuple[str, torch.Tensor]]  # checkpoint name -> (format, uint8 blocks)


def apply_quantization(
    model: nn.Module,
    method: str,
    path: Path,
    hf_config: PretrainedConfig,
    device: torch.device,
    tp_size: int,
) -> dict[str, int]:
    """Pack `model`'s linear layers as `method` says; returns {format: layers packed}.

    ValueError naming --quantization for an unknown method, or int4/int8 off the CPU.
    """
    if method not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {method!r}")
    if method in ("int4", "int8") and device.type != "cpu":
        raise ValueError(f"--quantization {method} runs on the CPU only; use auto or none")
    if not packs_weights(method, path, device, tp_size):
        return {}
    # A rank of a tensor-parallel group holds slices: it quantizes those instead.
    file_blocks = _file_blocks(path, hf_config) if tp_size == 1 else {}
    counts: dict[str, int] = {}
    for module, names, dense in _packable(model):
        packed = _packed_weight(dense, names, file_blocks, method)
        if packed is None:
            continue
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


def packs_weights(method: str, path: Path, device: torch.device, tp_size: int) -> bool:
    """Whether `apply_quantization` will pack linear layers: int4/int8 always (on the CPU),
    auto for a GGUF file on the CPU at one rank (its Q4/Q8 tensors)."""
    if device.type != "cpu" or method == "none":
        return False
    return method in ("int4", "int8") or (tp_size == 1 and path.suffix == ".gguf")


def _file_blocks(path: Path, hf_config: PretrainedConfig) -> Blocks:
    if not path.is_file():
        return {}
    from radixrt.loader.gguf_loader import GGUFCheckpoint

    return GGUFCheckpoint(path).packed_blocks(hf_config)


def _packable(model: nn.Module) -> Iterator[tuple[nn.Module, list[str], torch.Tensor]]:
    """(module, the checkpoint names of its weight in row order, its dense weight) for each
    linear layer and the LM head (named by, and reading, the embedding's matrix when tied)."""
    embedding_name, embedding = next(
        (name, m) for name, m in model.named_modules() if isinstance(m, VocabParallelEmbedding)
    )
    for prefix, module in model.named_modules():
        if isinstance(module, MergedLinear):
            parent = prefix.rpartition(".")[0]
            names = [f"{parent}.{shard}.weight" for shard in module.shard_names]
            yield module, names, module.weight
        elif isinstance(module, PackableLinear):
            yield module, [f"{prefix}.weight"], module.weight
        elif isinstance(module, LMHead) and module.weight is None:
            yield module, [f"{embedding_name}.weight"], embedding.weight
        elif isinstance(module, LMHead) and module.weight is not None:
            yield module, [f"{prefix}.weight"], module.weight


def _packed_weight(
    dense: torch.Tensor, names: list[str], file_blocks: Blocks, method: str
) -> GGUFWeight | None:
    in_features = dense.shape[1]
    if in_features % BLOCK:
        logger.info(
            "not quantized (in_features %d, not a multiple of %d): %s", in_features, BLOCK, names
        )
        return None
    formats = {file_blocks[n][0] for n in names if n in file_blocks}
    all_in_file = all(n in file_blocks for n in names) and len(formats) == 1
    if all_in_file and (method == "auto" or formats == {method}):
        blocks = torch.cat([file_blocks[n][1] for n in names])
        return GGUFWeight(blocks, formats.pop(), in_features)
    if method == "auto":
        return None
    return GGUFWeight(quantize(dense, method), method, in_features)


def _pack(module: nn.Module, packed: GGUFWeight) -> None:
    if isinstance(module, PackableLinear):
        module.pack(packed)
    else:
        assert isinstance(module, LMHead)
        module.packed = packed
        if module.weight is not None:
            del module.weight
            module.register_parameter("weight", None)


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} layers as {fmt}" for fmt, n in sorted(counts.items()))
