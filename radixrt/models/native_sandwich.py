"""Gemma 3's layers as one native call on the CPU (`radixrt::sandwich_layers`,
radixrt/native/csrc/sandwich_layers.cpp), as native_stack.py does for the plain decoder.

It applies to `SandwichNormLayer`s of `QKNormAttention` with GemmaRMSNorm q/k norms and a
GeGLU `GatedMLP`, without biases, on one rank, with dense or GGUF-packed projections: the op
runs the modules' native ops in their order, so its output equals theirs bit for bit
(tests/unit/test_native_stack.py). Windowed layers attend over each sequence's whole key list
with the kernel's window (no shared-prefix cascade, as the torch backend does for them); the
global layers take the backend's plan with its cascades.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from radixrt.layers.attention import QKNormAttention
from radixrt.layers.decoder import SandwichNormLayer
from radixrt.layers.mlp import GatedMLP
from radixrt.layers.norm import GemmaRMSNorm
from radixrt.layers.quantized import COPY_FROM_ROWS, DENSE_FROM_ROWS, INT8_ROWS
from radixrt.models.native_stack import (
    DENSE,
    Rope,
    dense_copy,
    kind_of,
    native_step,
    plain_projection,
    weight_of,
)
from radixrt.native.build import load_native

if TYPE_CHECKING:
    from radixrt.attention.forward_batch import ForwardBatch
    from radixrt.attention.torch_backend import TorchAttentionMetadata
    from radixrt.layers.linear import PackableLinear
    from radixrt.layers.norm import RMSNorm


class SandwichLayerStack:
    """Per layer: the input norm, qkv, the q and k norms, o, the post-attention and
    pre-MLP norms, gate_up, the post-MLP norm and down (norms as their float32 multipliers),
    then the final norm; `kinds`, dense copies and their scales per projection."""

    def __init__(self, layers: list[SandwichNormLayer], final_norm: GemmaRMSNorm) -> None:
        self.weights: list[torch.Tensor] = []
        self.kinds: list[int] = []
        self.dense_copies: list[torch.Tensor] = []
        self.copy_scales: list[torch.Tensor] = []
        self.dense_dtypes: set[torch.dtype] = set()
        for layer in layers:
            attn = layer.self_attn
            projections = _projections(layer)
            w = [weight_of(p) for p in projections]
            norms = [
                layer.input_layernorm, attn.q_norm, attn.k_norm, layer.post_attention_layernorm,
                layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm,
            ]  # fmt: skip
            m = [_multiplier(n) for n in norms]
            self.weights += [m[0], w[0], m[1], m[2], w[1], m[3], m[4], w[2], m[5], w[3]]
            self.kinds += [kind_of(p) for p in projections]
            self.dense_copies += [dense_copy(p, "dense") for p in projections]
            self.copy_scales += [dense_copy(p, "dense_scale") for p in projections]
            dense = zip(w, projections, strict=True)
            self.dense_dtypes |= {t.dtype for t, p in dense if p.packed is None}
        self.weights.append(_multiplier(final_norm))
        self.quantized = any(kind != DENSE for kind in self.kinds)
        packed = [p.packed for layer in layers for p in _projections(layer) if p.packed]
        self.int8_rows = packed[0].int8_rows if packed else INT8_ROWS
        # One row count for every projection: the copies' from the first that lacks tiles.
        self.copy_from_rows = min((p.copy_from_rows for p in packed), default=COPY_FROM_ROWS)
        self.windows = [layer.self_attn.window for layer in layers]
        self.num_heads = layers[0].self_attn.num_heads
        self.scaling = layers[0].self_attn.scaling
        self.eps = final_norm.eps
        self.ops: Any = load_native()

    @classmethod
    def build(cls, layers: list[Any], final_norm: RMSNorm) -> SandwichLayerStack | None:
        """The stack of these layers, or None unless the op computes what their modules do."""
        if not isinstance(final_norm, GemmaRMSNorm) or load_native() is None:
            return None
        supported = (
            len(layers) > 0
            and all(_gemma_layer(layer, final_norm.eps) for layer in layers)
            and len({layer.self_attn.scaling for layer in layers}) == 1
        )
        return cls(layers, final_norm) if supported else None

    def can_run(self, hidden: torch.Tensor, batch: ForwardBatch) -> bool:
        return native_step(hidden, batch, self.dense_dtypes, self.quantized)

    def __call__(
        self, hidden: torch.Tensor, rope: Rope, sliding: Rope, batch: ForwardBatch
    ) -> torch.Tensor:  # scaled embeddings [T, hidden] -> the final norm's output
        meta: TorchAttentionMetadata = batch.attn_metadata  # type: ignore[assignment]
        plan = meta.native
        assert plan is not None
        pool = batch.kv_pool
        (cos, sin), (sliding_cos, sliding_sin) = rope, sliding
        return self.ops.sandwich_layers(  # type: ignore[no-any-return]
            hidden, cos.contiguous(), sin.contiguous(), sliding_cos.contiguous(),
            sliding_sin.contiguous(), self.weights, self.kinds, self.dense_copies,
            self.copy_scales, pool.k_buffer, pool.v_buffer, batch.out_cache_loc,
            plan.qo_indptr, plan.kv_indptr, plan.kv_indices,
            [c.rows for c in plan.cascades], [c.prefix_slots for c in plan.cascades],
            batch.kv_indptr, batch.kv_indices, self.windows, self.num_heads, self.eps,
            self.scaling, DENSE_FROM_ROWS, self.copy_from_rows, self.int8_rows,
        )  # fmt: skip


def _projections(layer: SandwichNormLayer) -> tuple[PackableLinear, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)


def _multiplier(norm: Any) -> torch.Tensor:  # a GemmaRMSNorm
    multiplier = norm.multiplier
    return (1.0 + norm.weight.float()) if multiplier is None else multiplier


def _gemma_layer(layer: Any, eps: float) -> bool:
    # Exact types: what happens between the ops is the modules' as written here.
    if type(layer) is not SandwichNormLayer or type(layer.self_attn) is not QKNormAttention:
        return False
    attn, mlp = layer.self_attn, layer.mlp
    if type(mlp) is not GatedMLP or mlp.act != "gelu_pytorch_tanh" or not attn.rotary:
        return False
    norms = (
        layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
        layer.post_feedforward_layernorm, attn.q_norm, attn.k_norm,
    )  # fmt: skip
    if any(type(n) is not GemmaRMSNorm or n.eps != eps for n in norms):
        return False
    one_rank = attn.o_proj.group.size == 1 and mlp.down_proj.group.size == 1
    # The sandwich op takes no biases (Gemma 3 has none).
    projections = _projections(layer)
    return one_rank and all(p.bias is None and plain_projection(p) for p in projections)
