"""What the loader reads beside the layers' shape (layers/config.py's TransformerConfig, the one
model config): the architecture's name, the EOS ids of config.json and generation_config.json,
and the dtype the weights load in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from radixrt.native.cpu import cpu_has_bf16

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def architecture_of(hf_config: Any) -> str:
    archs = getattr(hf_config, "architectures", None)
    if not archs:
        raise ValueError("config.json has no 'architectures' entry naming the model class")
    return archs[0]


def eos_token_ids(hf_config: Any, model_dir: str | Path | None) -> list[int]:
    """EOS ids of config.json, then those of generation_config.json (if the folder has one)."""
    ids = _as_list(getattr(hf_config, "eos_token_id", None))
    gen_path = Path(model_dir) / "generation_config.json" if model_dir else None
    if gen_path is not None and gen_path.is_file():
        ids += _as_list(json.loads(gen_path.read_text()).get("eos_token_id"))
    return list(dict.fromkeys(ids))


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def resolve_dtype(
    dtype: str | torch.dtype, device: str | torch.device = "cpu", packed: bool = False
) -> torch.dtype:
    """A torch dtype from a name ("float32", "bfloat16", "float16") or "auto": bfloat16 on
    CUDA (float16 where bf16 is unsupported). On the CPU bfloat16 where it has bf16 matmul
    units; without them bfloat16 too for a model whose linear layers are `packed` (a GGUF
    file, --quantization int4/int8) when the native kernels run, else float32. Packed layers
    multiply in float32 or integers whatever the dtype (wide steps widen a bfloat16 x where no
    bf16 units would multiply it), and under bfloat16 steps of 1-31 rows take int8
    activations (quantized.int8_rows_for): on AVX2 paths that measured 1.6x float32's batch-1
    decode and level or better elsewhere (docs/quantization.md). A dense model without bf16
    units keeps float32, whose matmuls are then 2-3x faster. Raises ValueError for anything
    else."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if str(device).startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_bf16() or (packed and _native_kernels()) else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def _native_kernels() -> bool:
    from radixrt.layers.quantized import native_ops_loaded  # imports torch ops: only when asked

    return native_ops_loaded()
