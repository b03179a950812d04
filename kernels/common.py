"""Small helpers shared by the attention kernels."""

from __future__ import annotations

import os

import torch
import triton.language as tl

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The operand dtype of tl.dot for inputs of `dtype`.

    The interpreter computes a bfloat16 tl.dot wrongly (numpy has no bfloat16), so there the
    operands, already rounded to bfloat16, are widened to float32 instead: the same values,
    only the accumulation order may differ from the GPU's."""
    if dtype == torch.bfloat16 and interpreting():
        return tl.float32
    return _TL_DTYPES[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """float32 operands must not silently drop to TF32 on the tensor cores: greedy tokens of a
    float32 model would drift from the torch backend's."""
    return "ieee" if dot_dtype(dtype) == tl.float32 else "tf32"
