"""Model architectures by their Hugging Face `architectures[0]` name, imported lazily."""

from __future__ import annotations

import importlib

from torch import nn

_MODELS = {
    "LlamaForCausalLM": "radixrt.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "radixrt.models.qwen2:Qwen2ForCausalLM",
    "MistralForCausalLM": "radixrt.models.mistral:MistralForCausalLM",
}
SUPPORTED_ARCHITECTURES = tuple(sorted(_MODELS))


def get_model_class(architecture: str) -> type[nn.Module]:
    """The model class for an HF architecture name; ValueError naming it if unsupported."""
    if architecture not in _MODELS:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    module_name, cls_name = _MODELS[architecture].split(":")
    return getattr(importlib.import_module(module_name), cls_name)
