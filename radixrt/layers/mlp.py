"""The SwiGLU feed-forward block of the Llama family."""

from __future__ import annotations

import torch
from torch import nn

from radixrt.layers.activation import silu_and_mul
from radixrt.layers.linear import MergedLinear


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one matmul (`gate_up_proj`,
    loaded from the checkpoint's `gate_proj` and `up_proj`)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(
            hidden_size, [intermediate_size] * 2, ["gate_proj", "up_proj"], bias
        )
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
