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


# The dtypes dense_linear multiplies with radixrt's kernel (others: F.linear).
NATIVE_MATMUL_DTYPES = (torch.float32, torch.bfloat16)


def dense_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear; float32 and bfloat16 on the CPU through radixrt's matmul
    (native/csrc/float_matmul.cpp, which the native layer stack calls too): each output summed
    in one order whatever the row count, so that a request's bits never depend on its batch
    (docs/determinism.md). Not under torch.compile, where inductor lowers F.linear itself."""
    ops = native_cpu(x)
    if ops is not None and x.dtype == weight.dtype and x.dtype in NATIVE_MATMUL_DTYPES:
        flat = x.reshape(-1, x.shape[-1])
        y = torch.ops.radixrt.dense_linear.default(flat, weight, bias)
        return y.reshape(*x.shape[:-1], weight.shape[0])  # type: ignore[no-any-return]
    return F.linear(x, weight, bias)
