"""Which fused kernels the layers take: Triton's on CUDA (radixrt.kernels.fused_layers), radixrt's
native C++ ops on the CPU (radixrt/native/csrc/cpu_layers.cpp), else the torch reference path."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from radixrt.kernels import has_triton
from radixrt.native.build import load_native


def use_triton(x: torch.Tensor) -> bool:
    """On CUDA tensors only: on the CPU the torch path is faster than anything Triton offers
    there (its interpreter), and it is the reference the kernels are tested against."""
    return x.is_cuda and has_triton()


def native_cpu(x: torch.Tensor) -> Any | None:
    """The native ops (`radixrt.native.build.NativeOps`) for a CPU tensor when they are built, else
    None.

    Not under torch.compile: there inductor fuses the torch path itself, and better than an
    opaque call per op would let it."""
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return load_native()


ONEDNN = torch.backends.mkldnn.is_available()


def dense_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear; float32 on the CPU through oneDNN's matmul instead of the BLAS (twice as fast
    on an AVX-512 EPYC: native/csrc/dense_linear.cpp, which the native layer stack calls, says
    why). Not under torch.compile: inductor lowers that op only for constant weights."""
    if (
        ONEDNN
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == "cpu"
        and not torch.compiler.is_compiling()
    ):
        return torch.ops.mkldnn._linear_pointwise.default(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
