"""Qwen2: Llama with biases on the q/k/v projections (none on o_proj or the MLP)."""

from __future__ import annotations

from transformers import PretrainedConfig

from radixrt.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        super().check_config(config)
        window = getattr(config, "sliding_window", None)
        if getattr(config, "use_sliding_window", False) and window is not None:
            if window < config.max_position_embeddings:
                raise ValueError(
                    "use_sliding_window=True with sliding_window "
                    f"({window}) < max_position_embeddings ({config.max_position_embeddings}) "
                    "is not supported"
                )

    @classmethod
    def biases(cls, config: PretrainedConfig) -> tuple[bool, bool, bool]:
        return True, False, False
