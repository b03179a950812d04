"""The model config a GGUF file describes, as a plain object: the fields the models read
(TransformerConfig.from_hf and each model's config_from_hf), with transformers' defaults for
those a file leaves out.

Not transformers' config classes: importing one (LlamaConfig's module) pulls in 968 modules
(its hub kernels, accelerate, sympy, ...), about 90 MiB of a scheduler's memory and 1.4 s of
its start, for a default model whose weights take 120 MiB. tests/unit/test_gguf_config.py
holds every default here to transformers' own and every config to the one its class builds.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

# What every architecture's class defaults to, for the fields the models read.
_COMMON: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}
_NO_WINDOW = {"use_sliding_window": False, "sliding_window": None}

# transformers' model_type -> its config class's defaults that differ from _COMMON (and the
# EOS/BOS ids a file without tokenizer.ggml ids would get from it).
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"bos_token_id": 1, "eos_token_id": 2},
    "qwen2": dict(_NO_WINDOW),
    "qwen3": {**_NO_WINDOW, "head_dim": 128},
    "qwen3_moe": {
        **_NO_WINDOW,
        "decoder_sparse_step": 1,
        "norm_topk_prob": False,
        "mlp_only_layers": [],
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
    },
    "gemma3_text": {
        "hidden_activation": "gelu_pytorch_tanh",
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
    },
    "smollm3": {
        **_NO_WINDOW,
        "rope_theta": 2000000.0,
        "no_rope_layer_interval": 4,
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    "phi3": {
        "rms_norm_eps": 1e-5,
        "original_max_position_embeddings": 4096,
        "sliding_window": None,
        "bos_token_id": 1,
        "eos_token_id": 32000,
    },
}


class GGUFConfig(SimpleNamespace):
    """Attributes as transformers' config class for `model_type` would set them from the same
    fields, for what radixrt reads; a field nobody set is absent (getattr's default)."""

    model_type: str


def gguf_config(model_type: str, fields: dict[str, Any]) -> GGUFConfig:
    """The config of `model_type` (a key of HF_DEFAULTS) with `fields` over its defaults."""
    return GGUFConfig(model_type=model_type, **{**_COMMON, **HF_DEFAULTS[model_type], **fields})
