"""The pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(.))."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixrt.layers.attention import RotaryAttention
from radixrt.layers.mlp import GatedMLP
from radixrt.layers.moe import SparseMoE
from radixrt.layers.norm import RMSNorm

if TYPE_CHECKING:
    from radixrt.attention.forward_batch import ForwardBatch


class DecoderLayer(nn.Module):
    """One transformer block from the attention and MLP blocks it is given.

    The residual add is deferred into the next norm (`RMSNorm.add_and_norm`), where CUDA fuses
    the two; the sums are the same as the reference's.
    """

    def __init__(
        self, self_attn: RotaryAttention, mlp: GatedMLP | SparseMoE, hidden_size: int, eps: float
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]: the previous layer's MLP output (or the embeddings)
        residual: torch.Tensor | None,  # [T, hidden]: the residual stream before that output
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (MLP output, residual stream), [T, hidden] each
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, batch)
        hidden, residual = self.post_attention_layernorm.add_and_norm(hidden, residual)
        return self.mlp(hidden), residual


class SandwichNormLayer(nn.Module):
    """Gemma's block: norms before and after both attention and MLP,
    x + post_attn(attn(in(x))), then + post_ffw(mlp(pre_ffw(.))).

    The same deferred residual as DecoderLayer: the stream is (returned hidden) + residual,
    added inside the next norm; the sums are transformers' (residual + output).
    """

    def __init__(
        self, self_attn: RotaryAttention, mlp: GatedMLP, norm: Callable[[], RMSNorm]
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # as DecoderLayer.forward
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(hidden, cos, sin, batch))
        hidden, residual = self.pre_feedforward_layernorm.add_and_norm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual
