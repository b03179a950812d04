"""Which fused kernels the layers take: Triton's on CUDA (radixrt.kernels.fused_layers), radixrt's
native C++ ops on the CPU (radixrt/csrc/cpu_layers.cpp), else the torch reference path."""

from __future__ import annotations

from typing import Any

import torch

from radixrt.kernels import has_triton
from radixrt.native import load_native


def use_triton(x: torch.Tensor) -> bool:
    """On CUDA tensors only: on the CPU the torch path is faster than anything Triton offers
    there (its interpreter), and it is the reference the kernels are tested against."""
    return x.is_cuda and has_triton()


def native_cpu(x: torch.Tensor) -> Any | None:
    """The native ops (`radixrt.native.NativeOps`) for a CPU tensor when they are built, else
    None.

    Not under torch.compile: there inductor fuses the torch path itself, and better than an
    opaque call per op would let it."""
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return load_native()
