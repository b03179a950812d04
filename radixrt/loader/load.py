"""load_model: a model folder (config.json + safetensors) or a .gguf file -> model + config."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from radixrt.distributed import TPGroup
from radixrt.layers.config import TransformerConfig
from radixrt.layers.quantized import INT8_EVERY_STEP, GGUFWeight, int8_rows_for, native_ops_loaded
from radixrt.layers.sharding import CheckpointTensor
from radixrt.loader.hf_config import architecture_of, eos_token_ids, resolve_dtype
from radixrt.loader.quantize import (
    Checkpoint,
    apply_quantization,
    keep_dense_copies,
    keep_int8_tiles,
    pack_file_weights,
    packs_weights,
)
from radixrt.loader.weights import iter_safetensors, safetensors_files
from radixrt.models.base import CausalLM
from radixrt.models.registry import get_model_class
from radixrt.native.memory import release_freed_memory
from radixrt.observability.log_setup import format_bytes

Weights = Iterator[tuple[str, CheckpointTensor]]

logger = logging.getLogger("radixrt.loader")


def load_model(
    model_path: str,
    dtype: torch.dtype | str,
    device: str | torch.device,
    group: TPGroup | None = None,
    quantization: str = "none",
    dense_copy_gb: float = 0.0,
    dense_copy_dtype: str = "bfloat16",
    int8_rows: int | None = None,
) -> tuple[CausalLM, TransformerConfig]:
    """Build the model for `model_path` and load its weights, in `dtype` on `device`.

    `dtype` may also be a name or "auto" (see `resolve_dtype`). `dense_copy_gb`: the GiB that
    copies of packed weights in `dense_copy_dtype` (bfloat16 or int8) may take for wide batches
    on the CPU (see `keep_dense_copies`; 0: none), and beside them the int8 kernel's tiles
    (`keep_int8_tiles`). Packed weights multiply steps of up to
    `int8_rows` rows with int8 activations (`int8_rows_for`: None picks by dtype; -1: every
    step, and then no dense copies are kept, as no step would use them; 0: never). Returns the
    model in eval mode, without gradients. With a tensor-parallel `group` of more than one
    rank the model is this rank's part (see docs/tensor_parallel.md), and only its shards are
    read: slices of the safetensors files, or slices of each GGUF tensor once dequantized. The
    returned config (the model's own, with the EOS ids and dtype) describes the whole model;
    `model.num_local_kv_heads` is what the rank's KV pool holds.
    Raises FileNotFoundError naming the path for a missing path, a folder without config.json
    or without weight files; ValueError for an unsupported architecture or config field (or
    one --tp-size does not divide), and for weights that leave a parameter unset.
    """
    group = group or TPGroup.single()
    start = time.monotonic()
    path = Path(model_path)
    packs = packs_weights(quantization, path, torch.device(device), group.size)
    resolved = resolve_dtype(dtype, device, packed=packs)
    logger.info(
        "loading weights: %s (%s on %s)", path, str(resolved).removeprefix("torch."), device
    )
    hf_config, checkpoint, model_dir = _open_checkpoint(path, lazy=group.size > 1)
    model_cls = get_model_class(architecture_of(hf_config))
    config = model_cls.config_from_hf(hf_config)  # raises before any weight is read
    eos = eos_token_ids(hf_config, model_dir)
    config = dataclasses.replace(config, eos_token_ids=eos, dtype=resolved)
    # Build on the meta device, so that no memory is spent on (or time on initializing) weights
    # that load_weights overwrites anyway; it raises for any parameter left unset.
    with torch.device("meta"):
        model = model_cls(config, group)
    model = model.to(dtype=resolved).to_empty(device=device)
    packed = pack_file_weights(
        model, quantization, path, checkpoint, torch.device(device), group.size
    )
    model.load_weights(checkpoint.weights(packed))
    model.eval().requires_grad_(False)
    apply_quantization(model, quantization)
    rows = int8_rows_for(int8_rows, resolved)
    for weight in model.modules():
        if isinstance(weight, GGUFWeight):
            weight.int8_rows = rows
    if rows > 0 and torch.device(device).type == "cpu":
        keep_int8_tiles(model, dense_copy_gb, int8_only=rows == INT8_EVERY_STEP)
    every_step_int8 = rows == INT8_EVERY_STEP and native_ops_loaded()  # no copy would be read
    if resolved == torch.bfloat16 and torch.device(device).type == "cpu" and not every_step_int8:
        keep_dense_copies(model, dense_copy_gb, dense_copy_dtype)
    elif dense_copy_dtype != "bfloat16":  # asked for W8A8 copies where none are kept
        logger.warning(
            "cpu_dense_copy_dtype %s ignored: copies are kept for bfloat16 on the CPU only, and "
            "not with int8 activations at every step (this model runs in %s on %s)",
            dense_copy_dtype, resolved, device,
        )  # fmt: skip
    # Reading and packing the file freed about as much heap as the weights take (73 MiB of
    # the default model's Q4_K_M stayed resident until trimmed).
    release_freed_memory()
    logger.info(
        "loaded weights: %s in %.1f s",
        format_bytes(_weight_bytes(model)),
        time.monotonic() - start,
    )
    return model, config


class _Folder:
    """A model folder's safetensors, as a checkpoint that packs nothing."""

    def __init__(self, path: Path, lazy: bool) -> None:
        self.path, self.lazy = path, lazy

    def weights(self, skip: frozenset[str]) -> Weights:
        return iter_safetensors(self.path, self.lazy)


def _open_checkpoint(path: Path, lazy: bool) -> tuple[Any, Checkpoint, Path | None]:
    """(the HF config, the weights, the model folder): transformers is imported for a folder
    only; a GGUF file's config is gguf_config.py's."""
    if not path.exists():
        raise FileNotFoundError(f"model path not found: {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise FileNotFoundError(f"model path {path} is a file but not a .gguf file")
        from radixrt.loader.gguf_loader import GGUFCheckpoint

        gguf = GGUFCheckpoint(path)
        return gguf.hf_config(), gguf, None
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in model folder {path}")
    safetensors_files(path)  # fail early, before building the model, if there are none
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    return config, _Folder(path, lazy), path


def _weight_bytes(model: torch.nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
