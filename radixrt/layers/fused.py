"""When the layers take their fused Triton kernels (radixrt.kernels.fused_layers)."""

from __future__ import annotations

import torch

from radixrt.kernels import has_triton


def use_triton(x: torch.Tensor) -> bool:
    """On CUDA tensors only: on the CPU the torch path is faster than anything Triton offers
    there (its interpreter), and it is the reference the kernels are tested against."""
    return x.is_cuda and has_triton()
