"""Llama: the shared decoder as it is, with optional biases (`attention_bias`, `mlp_bias`)."""

from __future__ import annotations

from typing import Any

from radixrt.layers.config import TransformerConfig
from radixrt.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        attn_bias = bool(getattr(hf_config, "attention_bias", False))
        mlp_bias = bool(getattr(hf_config, "mlp_bias", False))
        return TransformerConfig.from_hf(
            hf_config, qkv_bias=attn_bias, o_bias=attn_bias, mlp_bias=mlp_bias
        )
