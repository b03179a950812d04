"""Mistral: Llama's layers; sliding-window attention is not implemented, so a window shorter
than the context is refused."""

from __future__ import annotations

from transformers import PretrainedConfig

from radixrt.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        super().check_config(config)
        window = getattr(config, "sliding_window", None)
        if window is not None and window < config.max_position_embeddings:
            raise ValueError(
                f"sliding_window ({window}) < max_position_embeddings "
                f"({config.max_position_embeddings}) is not supported; "
                "sliding_window must be null or >= max_position_embeddings"
            )
