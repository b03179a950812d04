"""Activation functions of the gated MLP."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from radixrt.layers.fused import native_cpu, use_triton


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused projection: [T, 2*I] (gate then up) -> silu(gate) * up, [T, I]."""
    if use_triton(gate_up):
        from radixrt.kernels.fused_layers import silu_and_mul as fused

        return fused(gate_up)
    ops = native_cpu(gate_up)
    if ops is not None and gate_up.dim() == 2 and gate_up.stride(1) == 1:
        return ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU (Gemma's MLP): [T, 2*I] -> gelu(gate, tanh approximation) * up, [T, I], the ops
    transformers' `gelu_pytorch_tanh` runs."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def gated_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The `act(gate) * up` of an HF activation name (config.GATED_ACTIVATIONS)."""
    return {"silu": silu_and_mul, "gelu_pytorch_tanh": gelu_tanh_and_mul}[name]
