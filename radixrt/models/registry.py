"""Model architectures by their Hugging Face `architectures[0]` name, imported lazily."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixrt.models.base import CausalLM

_MODELS = {
    "LlamaForCausalLM": "radixrt.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "radixrt.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "radixrt.models.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "radixrt.models.qwen3_moe:Qwen3MoeForCausalLM",
    "MistralForCausalLM": "radixrt.models.mistral:MistralForCausalLM",
    "Gemma3ForCausalLM": "radixrt.models.gemma3:Gemma3ForCausalLM",
    "SmolLM3ForCausalLM": "radixrt.models.smollm3:SmolLM3ForCausalLM",
    "Phi3ForCausalLM": "radixrt.models.phi3:Phi3ForCausalLM",
}
SUPPORTED_ARCHITECTURES = tuple(sorted(_MODELS))


def check_supported(architecture: str) -> None:
    """ValueError naming an HF architecture this runtime has no model for, and those it has."""
    if architecture not in _MODELS:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def get_model_class(architecture: str) -> type[CausalLM]:
    """The model class for an HF architecture name; ValueError naming it if unsupported."""
    check_supported(architecture)
    module_name, cls_name = _MODELS[architecture].split(":")
    model_cls: type[CausalLM] = getattr(importlib.import_module(module_name), cls_name)
    return model_cls
