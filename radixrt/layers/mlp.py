"""The SwiGLU feed-forward block of the Llama family."""

from __future__ import annotations

import torch
from torch import nn

from radixrt.distributed import TPGroup
from radixrt.layers.activation import gated_activation
from radixrt.layers.linear import MergedLinear, RowParallelLinear


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), act SiLU (`act` another of config.GATED_ACTIVATIONS: Gemma's
    GELU), with gate and up fused into one matmul (`gate_up_proj`,
    loaded from the checkpoint's `gate_proj` and `up_proj`). With tensor parallelism a rank holds
    its slice of the intermediate size in gate, up and down alike; down_proj sums the ranks'."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        group: TPGroup | None = None,
        act: str = "silu",
    ) -> None:
        super().__init__()
        group = group or TPGroup.single()
        self.act = act
        self.act_and_mul = gated_activation(act)
        self.gate_up_proj = MergedLinear.column_parallel(
            hidden_size, [intermediate_size] * 2, ["gate_proj", "up_proj"], bias, group
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))
