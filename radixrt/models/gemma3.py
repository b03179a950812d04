"""Gemma 3 (text): the shared decoder with Gemma's pieces.

- Layers in the checkpoint's pattern of sliding-window ("sliding_attention") and global
  ("full_attention") attention (`layer_types`, or every `sliding_window_pattern`-th layer
  global in older configs); the windowed layers take their own rotary base
  (`rope_parameters["sliding_attention"]`, formerly `rope_local_base_freq`).
- Per-head q/k norms, scores scaled by `query_pre_attn_scalar ** -0.5`.
- GemmaRMSNorm, (1 + w), four per layer: before and after attention and the MLP.
- The embeddings scaled by sqrt(hidden) in their dtype; the LM head tied to the unscaled ones.
- The GeGLU MLP (`gelu_pytorch_tanh`).

Logit soft-capping (Gemma 2's) and bidirectional attention (EmbeddingGemma) are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from radixrt.layers.attention import QKNormAttention, RotaryAttention
from radixrt.layers.config import GATED_ACTIVATIONS, RopeConfig, TransformerConfig
from radixrt.layers.decoder import SandwichNormLayer
from radixrt.layers.norm import GemmaRMSNorm
from radixrt.models.base import Weights
from radixrt.models.decoder import DecoderForCausalLM, DecoderModel

LAYER_TYPES = ("sliding_attention", "full_attention")


class Gemma3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        _refuse_unsupported(hf_config)
        full_rope, sliding_rope = _ropes(hf_config)
        config = TransformerConfig.from_hf(hf_config, rope=full_rope)
        window = int(hf_config.sliding_window or 0)
        return dataclasses.replace(
            config,
            hidden_act=hf_config.hidden_activation,
            layer_windows=tuple(
                window if kind == "sliding_attention" else 0 for kind in _layer_types(hf_config)
            ),
            sliding_rope=sliding_rope,
            attention_scale=float(hf_config.query_pre_attn_scalar) ** -0.5,
        )

    def make_model(self, layers: list[nn.Module]) -> DecoderModel:
        embed_scale = self.config.hidden_size**0.5
        return DecoderModel(self.config, layers, self.tp_group, GemmaRMSNorm, embed_scale)

    def make_attention(self, layer_id: int) -> RotaryAttention:
        shape, eps = self.attention_shape(layer_id), self.config.rms_norm_eps
        return QKNormAttention(layer_id, shape, eps, self.tp_group, GemmaRMSNorm)

    def make_layer(self, layer_id: int) -> nn.Module:
        c = self.config
        return SandwichNormLayer(
            self.make_attention(layer_id),
            self.make_mlp(),
            lambda: GemmaRMSNorm(c.hidden_size, c.rms_norm_eps),
        )

    def load_weights(self, weights: Weights) -> None:
        super().load_weights(weights)
        for module in self.modules():
            if isinstance(module, GemmaRMSNorm):
                module.weights_loaded()


def _refuse_unsupported(hf: Any) -> None:
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(hf, name, None) is not None:
            raise ValueError(f"{name} must be null (logit soft-capping is not supported)")
    if getattr(hf, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention must be false (a causal LM is served)")
    act = getattr(hf, "hidden_activation", None)
    if act not in GATED_ACTIVATIONS:
        raise ValueError(f"hidden_activation must be one of {list(GATED_ACTIVATIONS)}, got {act!r}")


def _ropes(hf: Any) -> tuple[RopeConfig, RopeConfig]:
    """(global layers' rope, sliding layers' rope): transformers 5's per-layer-type
    `rope_parameters`, or the older rope_theta / rope_scaling / rope_local_base_freq."""
    params = getattr(hf, "rope_parameters", None) or {}
    if "full_attention" in params:
        sliding = params.get("sliding_attention") or {"rope_theta": 10000.0}
        return RopeConfig.from_params(params["full_attention"]), RopeConfig.from_params(sliding)
    local_base = float(getattr(hf, "rope_local_base_freq", 10000.0))
    return RopeConfig.from_hf(hf), RopeConfig(theta=local_base)


def _layer_types(hf: Any) -> list[str]:
    kinds = getattr(hf, "layer_types", None)
    if kinds is None:
        pattern = int(getattr(hf, "sliding_window_pattern", 6))
        kinds = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(hf.num_hidden_layers)
        ]
    if len(kinds) != hf.num_hidden_layers or any(k not in LAYER_TYPES for k in kinds):
        raise ValueError(
            f"layer_types must list one of {list(LAYER_TYPES)} per layer "
            f"({hf.num_hidden_layers}), got {kinds}"
        )
    return list(kinds)
