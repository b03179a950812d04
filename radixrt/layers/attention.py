"""Self-attention with rotary positions over the paged KV pool (the Llama-family block)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixrt.distributed import TPGroup
from radixrt.layers.config import local_kv_heads
from radixrt.layers.linear import MergedLinear, RowParallelLinear
from radixrt.layers.norm import RMSNorm
from radixrt.layers.rotary import rotate_qk
from radixrt.layers.sharding import Narrow

if TYPE_CHECKING:
    from radixrt.attention.forward_batch import ForwardBatch


@dataclass(frozen=True, kw_only=True)
class AttentionShape:
    """The sizes and bias flags of an attention block."""

    hidden_size: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    qkv_bias: bool
    o_bias: bool
    window: int = 0  # sliding window (0: the whole context); see AttentionBackend.forward
    scaling: float | None = None  # the scores' scale; None: head_dim ** -0.5
    rotary: bool = True  # False: q and k keep no position (SmolLM3's NoPE layers)

    def local_kv_heads(self, tp: int) -> int:
        return local_kv_heads(self.num_kv_heads, tp)


class RotaryAttention(nn.Module):
    """Grouped-query attention: qkv projection, rotary on q and k, the batch's attention
    backend (which also stores this layer's K/V in the pool), output projection.

    `qkv_proj` stacks the checkpoint's q_proj, k_proj and v_proj. Subclasses change what
    happens to q and k between the projection and the rotary by overriding `transform_qk`
    (QKNormAttention normalizes each head there). Scaling is head_dim ** -0.5 unless the
    shape sets it; a layer with a `window` attends only to that many latest positions.

    With tensor parallelism a rank holds num_heads / tp query heads and the KV heads they read
    (`AttentionShape.local_kv_heads`): its attention is local, and `o_proj` sums the ranks'.
    """

    def __init__(self, layer_id: int, shape: AttentionShape, group: TPGroup | None = None) -> None:
        super().__init__()
        group = group or TPGroup.single()
        check_heads_divide(shape, group.size)
        self.layer_id = layer_id
        self.num_heads = shape.num_heads // group.size
        self.num_kv_heads = shape.local_kv_heads(group.size)
        self.head_dim = shape.head_dim
        self.q_size = self.num_heads * shape.head_dim
        self.kv_size = self.num_kv_heads * shape.head_dim
        self.scaling = shape.head_dim**-0.5 if shape.scaling is None else shape.scaling
        self.window = shape.window
        self.rotary = shape.rotary
        sizes = [self.q_size, self.kv_size, self.kv_size]
        names = ["q_proj", "k_proj", "v_proj"]
        narrows = _qkv_narrows(shape, group) if group.size > 1 else None
        self.qkv_proj = MergedLinear(shape.hidden_size, sizes, names, shape.qkv_bias, narrows)
        full_q = shape.num_heads * shape.head_dim
        self.o_proj = RowParallelLinear(full_q, shape.hidden_size, shape.o_bias, group)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]; cos/sin [T, 1, D/2]
        t = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, (Hq + 2 Hkv) * D]
        # q and k heads side by side get one rotary call: [T, Hq + Hkv, D] (in place on CUDA).
        qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
        qk = self.rotate(self.transform_qk(qk), cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        out = batch.attn_backend.forward(q, k, v, self.layer_id, batch, self.scaling, self.window)
        return self.o_proj(out.reshape(t, self.q_size))  # out: [T, Hq, D]

    def transform_qk(self, qk: torch.Tensor) -> torch.Tensor:
        """q and k heads before the rotary, [T, Hq + Hkv, D] -> same shape; as they are here."""
        return qk

    def rotate(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The rotary on q and k heads [T, Hq + Hkv, D] (the first 2 * cos.shape[-1] dims of
        each), or none on a layer without one."""
        return rotate_qk(qk, cos, sin) if self.rotary else qk


class QKNormAttention(RotaryAttention):
    """RotaryAttention with `q_norm` and `k_norm` [head_dim] applied to every head before the
    rotary (Qwen3 with RMSNorm, Gemma 3 with GemmaRMSNorm: `norm`)."""

    def __init__(
        self,
        layer_id: int,
        shape: AttentionShape,
        eps: float,
        group: TPGroup | None = None,
        norm: type[RMSNorm] = RMSNorm,
    ) -> None:
        super().__init__(layer_id, shape, group)
        self.q_norm = norm(self.head_dim, eps)
        self.k_norm = norm(self.head_dim, eps)

    def transform_qk(self, qk: torch.Tensor) -> torch.Tensor:  # [T, Hq + Hkv, D]
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        return torch.cat((_per_head(self.q_norm, q), _per_head(self.k_norm, k)), dim=1)


def _per_head(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    # [T, H, D] -> rows of D (a copy: x is a strided view into the qkv projection) -> [T, H, D]
    return norm(x.reshape(-1, x.shape[-1])).view(x.shape)


def check_heads_divide(shape: AttentionShape, tp: int) -> None:
    """ValueError naming --tp-size unless the ranks split the query heads evenly and the KV
    heads evenly (tp <= KV heads) or replicate them evenly (tp a multiple of the KV heads)."""
    if shape.num_heads % tp:
        raise ValueError(
            f"num_attention_heads ({shape.num_heads}) must be divisible by --tp-size ({tp})"
        )
    kv = shape.num_kv_heads
    if kv % tp and tp % kv:
        raise ValueError(
            f"--tp-size ({tp}) must divide num_key_value_heads ({kv}) or be a multiple of it"
        )


def _qkv_narrows(shape: AttentionShape, group: TPGroup) -> dict[str, Narrow]:
    # Query heads split evenly; this rank's KV heads start at the KV head its first query head
    # reads (rank * kv / tp, floored: with tp > kv consecutive ranks share, i.e. replicate, one).
    d = shape.head_dim
    q_heads = shape.num_heads // group.size
    kv_heads = shape.local_kv_heads(group.size)
    kv_start = group.rank * shape.num_kv_heads // group.size
    q = Narrow(0, group.rank * q_heads * d, q_heads * d, shape.num_heads * d)
    kv = Narrow(0, kv_start * d, kv_heads * d, shape.num_kv_heads * d)
    return {"q_proj": q, "k_proj": kv, "v_proj": kv}
