"""SmolLM3: the shared Llama-like decoder, whose NoPE layers take no rotary.

transformers' meaning of `no_rope_layers`: one entry per layer, 1 where the layer applies RoPE
and 0 where it does not (its default: every fourth layer, `(i + 1) % no_rope_layer_interval
== 0`, is NoPE; llama.cpp's GGUF files carry no list and hardcode that interval, 4). The
layers `layer_types` marks "sliding_attention" attend within `sliding_window` (by default,
with `use_sliding_window`, the NoPE layers): transformers' mask for those layers is the
sliding one whatever `use_sliding_window` says once `layer_types` lists them.
`attention_bias` and `mlp_bias` put biases on q/k/v/o and the MLP, as in Llama.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from radixrt.layers.config import TransformerConfig
from radixrt.models.decoder import DecoderForCausalLM

LAYER_TYPES = ("sliding_attention", "full_attention")


class SmolLM3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        bias = bool(getattr(hf_config, "attention_bias", False))
        mlp_bias = bool(getattr(hf_config, "mlp_bias", False))
        config = TransformerConfig.from_hf(hf_config, qkv_bias=bias, o_bias=bias, mlp_bias=mlp_bias)
        return dataclasses.replace(
            config, nope_layers=_nope_layers(hf_config), layer_windows=_windows(hf_config)
        )


def _nope_layers(hf: Any) -> tuple[int, ...]:
    n = hf.num_hidden_layers
    flags = getattr(hf, "no_rope_layers", None)
    if flags is None:
        interval = int(getattr(hf, "no_rope_layer_interval", 4))
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) < n or any(f not in (0, 1) for f in flags[:n]):
        raise ValueError(
            f"no_rope_layers must give 1 (RoPE) or 0 (no RoPE) for each of the {n} layers, "
            f"got {flags}"
        )
    return tuple(i for i in range(n) if not flags[i])


def _windows(hf: Any) -> tuple[int, ...]:
    kinds = getattr(hf, "layer_types", None) or ["full_attention"] * hf.num_hidden_layers
    if len(kinds) != hf.num_hidden_layers or any(k not in LAYER_TYPES for k in kinds):
        raise ValueError(
            f"layer_types must list one of {list(LAYER_TYPES)} per layer "
            f"({hf.num_hidden_layers}), got {kinds}"
        )
    if "sliding_attention" not in kinds:
        return ()
    window = getattr(hf, "sliding_window", None)
    if not window or window < 1:
        raise ValueError(f"sliding_window must be a positive integer for layer_types {kinds}")
    if window >= hf.max_position_embeddings:
        return ()  # no sequence is longer than the window: full attention is the same
    return tuple(window if k == "sliding_attention" else 0 for k in kinds)
