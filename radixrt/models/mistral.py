"""Mistral: the shared decoder without biases. Sliding-window attention is not implemented, so
a window shorter than the context is refused."""

from __future__ import annotations

from typing import Any

from radixrt.layers.config import TransformerConfig, refuse_sliding_window
from radixrt.models.decoder import DecoderForCausalLM


class MistralForCausalLM(DecoderForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        refuse_sliding_window(hf_config, enabled=True)
        return TransformerConfig.from_hf(hf_config)
