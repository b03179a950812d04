"""Self-attention with rotary positions over the paged KV pool (the Llama-family block)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixrt.layers.linear import MergedLinear
from radixrt.layers.rotary import rotate_qk

if TYPE_CHECKING:
    from radixrt.executor.forward_batch import ForwardBatch


@dataclass(frozen=True, kw_only=True)
class AttentionShape:
    """The sizes and bias flags of an attention block."""

    hidden_size: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    qkv_bias: bool
    o_bias: bool


class RotaryAttention(nn.Module):
    """Grouped-query attention: qkv projection, rotary on q and k, the batch's attention
    backend (which also stores this layer's K/V in the pool), output projection.

    `qkv_proj` stacks the checkpoint's q_proj, k_proj and v_proj. Subclasses change what
    happens to q and k between the projection and the rotary by overriding `transform_qk`
    (Qwen3 normalizes each head there). Scaling is head_dim ** -0.5.
    """

    def __init__(self, layer_id: int, shape: AttentionShape) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = shape.num_heads
        self.num_kv_heads = shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.q_size = shape.num_heads * shape.head_dim
        self.kv_size = shape.num_kv_heads * shape.head_dim
        self.scaling = shape.head_dim**-0.5
        sizes = [self.q_size, self.kv_size, self.kv_size]
        names = ["q_proj", "k_proj", "v_proj"]
        self.qkv_proj = MergedLinear(shape.hidden_size, sizes, names, shape.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, shape.hidden_size, shape.o_bias)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]; cos/sin [T, 1, D/2]
        t = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, (Hq + 2 Hkv) * D]
        # q and k heads side by side get one rotary call: [T, Hq + Hkv, D] (in place on CUDA).
        qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
        qk = rotate_qk(self.transform_qk(qk), cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        out = batch.attn_backend.forward(q, k, v, self.layer_id, batch, self.scaling)
        return self.o_proj(out.reshape(t, self.q_size))  # out: [T, Hq, D]

    def transform_qk(self, qk: torch.Tensor) -> torch.Tensor:
        """q and k heads before the rotary, [T, Hq + Hkv, D] -> same shape; as they are here."""
        return qk
