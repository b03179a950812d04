"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (per-head q/k norms) with transformers'
sparse mixture-of-experts MLP (layers/moe.py: softmax router, top-k, `norm_topk_prob`, no
shared expert) in every layer but those `mlp_only_layers` lists or `decoder_sparse_step` skips,
which keep a dense MLP of `intermediate_size`.

The experts load from per-expert tensors (`mlp.experts.{e}.gate_proj.weight`, ...: the
releases, and what transformers' save_pretrained writes), from transformers 5's fused ones
(`mlp.experts.gate_up_proj` [E, 2I, hidden], `mlp.experts.down_proj` [E, hidden, I]), or from a
GGUF file's `ffn_{gate,up,down}_exps` stacks (the GGUF loader splits those, keeping quantized
experts packed, one GGUFWeight per expert).

Routing decides on the host which experts run, so CUDA graphs and --enable-torch-compile are
not used for this model (`static_graphs`); sliding-window attention is refused, as for Qwen3.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from radixrt.layers.config import MoEConfig, TransformerConfig
from radixrt.layers.decoder import DecoderLayer
from radixrt.layers.mlp import GatedMLP
from radixrt.layers.moe import SparseMoE, unstack_experts
from radixrt.models.base import Weights
from radixrt.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    static_graphs = False

    @classmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        config = super().config_from_hf(hf_config)
        return dataclasses.replace(config, moe=moe_config(hf_config))

    def make_layer(self, layer_id: int) -> nn.Module:
        c = self.config
        mlp: GatedMLP | SparseMoE = self.make_mlp()
        if c.moe is not None and c.moe.sparse(layer_id):
            mlp = SparseMoE(c.hidden_size, c.moe, self.tp_group)
        return DecoderLayer(self.make_attention(layer_id), mlp, c.hidden_size, c.rms_norm_eps)

    def load_weights(self, weights: Weights) -> None:
        """See DecoderForCausalLM.load_weights; tensors of all experts are split per expert."""
        super().load_weights(unstack_experts(weights))


def moe_config(hf: Any) -> MoEConfig | None:
    """The experts' shape, with transformers' rule for which layers are sparse: those not in
    `mlp_only_layers` whose (index + 1) is a multiple of `decoder_sparse_step`. None without
    experts. ValueError naming the field for a top-k or step that cannot work."""
    num_experts = int(getattr(hf, "num_experts", 0) or 0)
    if num_experts == 0:
        return None
    top_k, step = int(hf.num_experts_per_tok), int(getattr(hf, "decoder_sparse_step", 1))
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"num_experts_per_tok must be in [1, {num_experts}], got {top_k}")
    if step < 1:
        raise ValueError(f"decoder_sparse_step must be >= 1, got {step}")
    mlp_only = set(getattr(hf, "mlp_only_layers", None) or ())
    layers = range(hf.num_hidden_layers)
    return MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        intermediate_size=int(hf.moe_intermediate_size),
        norm_topk_prob=bool(getattr(hf, "norm_topk_prob", False)),
        dense_layers=tuple(i for i in layers if i in mlp_only or (i + 1) % step),
    )
