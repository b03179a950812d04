"""The decoder-only LM the Llama family shares; an architecture is a subclass that says how its
Hugging Face config reads and, where its attention differs, which attention block it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixrt.distributed import TPGroup
from radixrt.layers.attention import AttentionShape, RotaryAttention
from radixrt.layers.config import TransformerConfig
from radixrt.layers.decoder import DecoderLayer
from radixrt.layers.embedding import LMHead, VocabParallelEmbedding
from radixrt.layers.mlp import GatedMLP
from radixrt.layers.norm import RMSNorm
from radixrt.layers.rotary import RotaryEmbedding
from radixrt.models.base import CausalLM, Weights
from radixrt.models.native_sandwich import SandwichLayerStack
from radixrt.models.native_stack import NativeLayerStack
from radixrt.models.weight_loader import load_hf_weights

if TYPE_CHECKING:
    from radixrt.attention.forward_batch import ForwardBatch

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class DecoderModel(nn.Module):
    """Token embedding, the decoder layers, the final norm (HF's `model.` submodule).

    Sliding-window layers take `config.sliding_rope`'s rotary where the config has one (Gemma
    3's local base); `embed_scale` multiplies the embeddings (Gemma: sqrt(hidden), in the
    embeddings' dtype, as transformers does)."""

    def __init__(
        self,
        config: TransformerConfig,
        layers: list[nn.Module],
        group: TPGroup,
        norm: type[RMSNorm] = RMSNorm,
        embed_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, group)
        self.embed_scale = embed_scale
        self.layers = nn.ModuleList(layers)
        self.norm = norm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope)
        self.windowed = [config.window_of(i) > 0 for i in range(len(layers))]
        self.sliding_rotary = None
        if config.sliding_rope is not None:
            self.sliding_rotary = RotaryEmbedding(config.head_dim, config.sliding_rope)
        # The layers as one native call on the CPU where that computes the same (built at
        # the first CPU forward, when the weights are final); set False to keep the modules.
        self.use_native_stack = True
        self._native_stack: NativeLayerStack | SandwichLayerStack | None = None
        self._native_stack_checked = False

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:  # [T], [T] -> [T, hidden]
        if batch.attn_metadata is None:
            batch.attn_backend.init_forward_metadata(batch)
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        if self.embed_scale is not None:
            scale = torch.tensor(self.embed_scale, dtype=torch.float32)  # transformers' rounding
            hidden = hidden * scale.to(hidden.dtype)
        # [T, 1, R/2] each (R: the rotated dims of a head), shared by the layers
        cos, sin = self.rotary.for_batch(positions, hidden.dtype, batch)
        sliding = (cos, sin)
        if self.sliding_rotary is not None:
            sliding = self.sliding_rotary.for_batch(positions, hidden.dtype, batch)
        stack = self.native_stack() if hidden.device.type == "cpu" else None
        if stack is not None and stack.can_run(hidden, batch):
            return stack(hidden, (cos, sin), sliding, batch)
        residual = None
        for layer, windowed in zip(self.layers, self.windowed, strict=True):
            c, s = sliding if windowed else (cos, sin)
            hidden, residual = layer(hidden, residual, c, s, batch)
        if residual is None:  # a model without layers
            return self.norm(hidden)
        return self.norm.add_and_norm(hidden, residual)[0]

    def native_stack(self) -> NativeLayerStack | SandwichLayerStack | None:
        """The layers' native op (models/native_stack.py), or None where it does not apply."""
        if not self.use_native_stack or self.rotary.rotary_dim != self.rotary.head_dim:
            return None  # the op rotates whole heads
        if not self._native_stack_checked:
            layers = list(self.layers)
            self._native_stack = NativeLayerStack.build(
                layers, self.norm
            ) or SandwichLayerStack.build(layers, self.norm)
            self._native_stack_checked = True
        return self._native_stack


class DecoderForCausalLM(CausalLM):
    """Embeddings, `num_layers` pre-norm blocks (`make_attention` + a gated MLP), final norm and
    an LM head (tied to the embeddings when the config says so: no `lm_head` parameter then).

    Parameters carry Hugging Face names, except the merged projections (qkv_proj, gate_up_proj),
    which `load_weights` fills from their parts. Built for one rank of `group`, every layer
    holds that rank's shards (see docs/tensor_parallel.md); the default is the unsharded model.
    """

    def __init__(self, config: TransformerConfig, group: TPGroup | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp_group = group or TPGroup.single()
        layers = [self.make_layer(i) for i in range(config.num_layers)]
        self.model = self.make_model(layers)
        self.lm_head = LMHead(
            config.hidden_size, config.vocab_size, config.tie_word_embeddings, self.tp_group
        )

    def make_model(self, layers: list[nn.Module]) -> DecoderModel:
        """The `model.` submodule around the layers; override for other norms or embeddings."""
        return DecoderModel(self.config, layers, self.tp_group)

    def make_attention(self, layer_id: int) -> RotaryAttention:
        """The attention block of layer `layer_id`; override for a different attention."""
        return RotaryAttention(layer_id, self.attention_shape(layer_id), self.tp_group)

    def attention_shape(self, layer_id: int) -> AttentionShape:
        c = self.config
        return AttentionShape(
            hidden_size=c.hidden_size,
            num_heads=c.num_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            qkv_bias=c.qkv_bias,
            o_bias=c.o_bias,
            window=c.window_of(layer_id),
            scaling=c.attention_scale,
            rotary=layer_id not in c.nope_layers,
        )

    def make_mlp(self) -> GatedMLP:
        c = self.config
        return GatedMLP(c.hidden_size, c.intermediate_size, c.mlp_bias, self.tp_group, c.hidden_act)

    def make_layer(self, layer_id: int) -> nn.Module:
        """Layer `layer_id`: a pre-norm DecoderLayer; override for another arrangement."""
        c = self.config
        attn, mlp = self.make_attention(layer_id), self.make_mlp()
        return DecoderLayer(attn, mlp, c.hidden_size, c.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        return self.model(input_ids, positions, batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden, self.model.embed_tokens)

    def load_weights(self, weights: Weights) -> None:
        """See CausalLM.load_weights. Ignores `rotary_emb.inv_freq` (recomputed) and, with tied
        embeddings, `lm_head.weight` (a copy of the embeddings some checkpoints carry)."""
        tied = self.config.tie_word_embeddings

        def skip(name: str) -> bool:
            return name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight")

        load_hf_weights(self, weights, skip)
