"""Qwen3: the shared decoder whose attention normalizes each q and k head (RMSNorm over
head_dim, one weight per projection) before the rotary. `head_dim` comes from the config (128
in the released models, whatever hidden_size / heads is); `attention_bias` puts biases on q, k, v
and o alike. Sliding-window attention is not implemented: a config that enables a window
shorter than the context is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from radixrt.distributed import TPGroup
from radixrt.layers.attention import AttentionShape, RotaryAttention
from radixrt.layers.config import TransformerConfig, refuse_sliding_window
from radixrt.layers.norm import RMSNorm
from radixrt.models.decoder import DecoderForCausalLM


class QKNormAttention(RotaryAttention):
    """RotaryAttention with `q_norm` and `k_norm` [head_dim] applied to every head."""

    def __init__(
        self, layer_id: int, shape: AttentionShape, eps: float, group: TPGroup | None = None
    ) -> None:
        super().__init__(layer_id, shape, group)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)

    def transform_qk(self, qk: torch.Tensor) -> torch.Tensor:  # [T, Hq + Hkv, D]
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        return torch.cat((_per_head(self.q_norm, q), _per_head(self.k_norm, k)), dim=1)


def _per_head(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    # [T, H, D] -> rows of D (a copy: x is a strided view into the qkv projection) -> [T, H, D]
    return norm(x.reshape(-1, x.shape[-1])).view(x.shape)


class Qwen3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        refuse_sliding_window(hf_config, bool(getattr(hf_config, "use_sliding_window", False)))
        bias = bool(getattr(hf_config, "attention_bias", False))
        return TransformerConfig.from_hf(hf_config, qkv_bias=bias, o_bias=bias)

    def make_attention(self, layer_id: int) -> RotaryAttention:
        shape, eps = self.attention_shape(), self.config.rms_norm_eps
        return QKNormAttention(layer_id, shape, eps, self.tp_group)
