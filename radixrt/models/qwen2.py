"""Qwen2: the shared decoder with biases on the q/k/v projections (none on o_proj or the MLP).

Sliding-window attention is not implemented: a config that enables a window shorter than the
context is refused.
"""

from __future__ import annotations

from typing import Any

from radixrt.layers.config import TransformerConfig, refuse_sliding_window
from radixrt.models.decoder import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        refuse_sliding_window(hf_config, bool(getattr(hf_config, "use_sliding_window", False)))
        return TransformerConfig.from_hf(hf_config, qkv_bias=True)
