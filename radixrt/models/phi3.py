"""Phi-3 and Phi-4-mini (Phi3ForCausalLM): the shared decoder with Phi-3's own checkpoint and
rotary.

- The checkpoint stacks q, k and v in `qkv_proj` and gate and up in `gate_up_proj`; the merged
  projections load them whole (each tensor-parallel rank its heads' rows and its slice of the
  intermediate size out of them: models/weight_loader.py).
- Partial rotary (`partial_rotary_factor`, 0.75 in Phi-4-mini): only the first
  int(head_dim * factor) dims of a head rotate.
- LongRoPE (`rope_scaling` type "longrope", formerly "su"): short or long per-frequency
  factors by the sequence's length against `original_max_position_embeddings`, cos and sin
  scaled by the attention factor (layers/rotary.py; docs/longrope.md for the serving rule).
- `sliding_window`, where set, bounds every layer's attention (transformers' mask); a window
  at least max_position_embeddings long (Phi-4-mini's 262,144) changes nothing and is dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from radixrt.layers.config import TransformerConfig
from radixrt.models.decoder import DecoderForCausalLM


class Phi3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        config = TransformerConfig.from_hf(hf_config)
        window = getattr(hf_config, "sliding_window", None)
        if window is None or window >= config.max_position_embeddings:
            return config
        if window < 1:
            raise ValueError(f"sliding_window must be null or a positive integer, got {window}")
        return dataclasses.replace(config, layer_windows=(int(window),) * config.num_layers)
