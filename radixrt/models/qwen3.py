"""Qwen3: the shared decoder whose attention normalizes each q and k head (RMSNorm over
head_dim, one weight per projection) before the rotary. `head_dim` comes from the config (128
in the released models, whatever hidden_size / heads is); `attention_bias` puts biases on q, k, v
and o alike. Sliding-window attention is not implemented: a config that enables a window
shorter than the context is refused.
"""

from __future__ import annotations

from typing import Any

from radixrt.layers.attention import QKNormAttention, RotaryAttention
from radixrt.layers.config import TransformerConfig, refuse_sliding_window
from radixrt.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        refuse_sliding_window(hf_config, bool(getattr(hf_config, "use_sliding_window", False)))
        bias = bool(getattr(hf_config, "attention_bias", False))
        return TransformerConfig.from_hf(hf_config, qkv_bias=bias, o_bias=bias)

    def make_attention(self, layer_id: int) -> RotaryAttention:
        shape, eps = self.attention_shape(layer_id), self.config.rms_norm_eps
        return QKNormAttention(layer_id, shape, eps, self.tp_group)
