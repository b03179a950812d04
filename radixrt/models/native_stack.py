"""The decoder's layers as one native call on the CPU (`radixrt::decoder_layers`,
radixrt/native/csrc/decoder_layers.cpp).

Through the modules a layer is ~15 Python-level calls; at batch 1 on a 135M model that Python
is a third of the step. The op runs the same native ops the modules would call on the CPU, in
the same order, so its output equals theirs bit for bit (tests/unit/test_native_stack.py). It
applies where the modules would take exactly those ops: plain `DecoderLayer`s of
`RotaryAttention` and `GatedMLP` (biases on any projection: Qwen2's q/k/v), one rank, dense
or GGUF-packed projections, the torch attention backend's native plan (its shared-prefix
cascades included), and the pool in the activations' dtype. Any other model or step keeps
the modules.

The weights are collected at the first forward, after loading and packing (which is when
they are final: nothing swaps a module's weight later).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from radixrt.attention.torch_backend import TorchAttentionMetadata
from radixrt.cache.kv_pool import KVPool
from radixrt.layers.attention import RotaryAttention
from radixrt.layers.decoder import DecoderLayer
from radixrt.layers.linear import PackableLinear
from radixrt.layers.mlp import GatedMLP
from radixrt.layers.quantized import COPY_FROM_ROWS, DENSE_FROM_ROWS, INT8_ROWS
from radixrt.native.build import load_native

if TYPE_CHECKING:
    from radixrt.attention.forward_batch import ForwardBatch
    from radixrt.layers.norm import RMSNorm

DENSE = -1  # the op's kind for a dense weight (GGUF kinds are GGUFWeight.kind)
Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [T, 1, D/2]


class NativeLayerStack:
    """The layers' weights as the op takes them: per layer the input norm, qkv, o, the post
    norm, gate_up and down, then the final norm; `kinds` says per projection whether it is
    dense or which GGUF format."""

    def __init__(self, layers: list[DecoderLayer], final_norm: RMSNorm) -> None:
        self.weights: list[torch.Tensor] = []
        self.kinds: list[int] = []
        self.dense_copies: list[torch.Tensor] = []  # per projection; empty: none
        self.copy_scales: list[torch.Tensor] = []  # an int8 copy's; empty: none
        self.biases: list[torch.Tensor] = []  # per projection; empty: none
        dtypes: set[torch.dtype] = set()  # of the norms and the dense projections
        for layer in layers:
            norm_in, norm_post = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
            projections = _projections(layer)
            w = [weight_of(p) for p in projections]
            self.weights += [norm_in, w[0], w[1], norm_post, w[2], w[3]]
            self.kinds += [kind_of(p) for p in projections]
            self.dense_copies += [dense_copy(p, "dense") for p in projections]
            self.copy_scales += [dense_copy(p, "dense_scale") for p in projections]
            biases = [p.bias for p in projections if p.bias is not None]
            self.biases += [torch.empty(0) if p.bias is None else p.bias for p in projections]
            dense = [t for t, p in zip(w, projections, strict=True) if p.packed is None]
            dtypes |= {t.dtype for t in (norm_in, norm_post, *dense, *biases)}
        self.weights.append(final_norm.weight)
        self.weight_dtypes = dtypes | {final_norm.weight.dtype}
        self.quantized = any(kind != DENSE for kind in self.kinds)
        packed = [p.packed for layer in layers for p in _projections(layer) if p.packed]
        self.int8_rows = packed[0].int8_rows if packed else INT8_ROWS  # one value per model
        # One row count for every projection: the copies' from the first that lacks tiles.
        self.copy_from_rows = min((p.copy_from_rows for p in packed), default=COPY_FROM_ROWS)
        self.num_heads = layers[0].self_attn.num_heads
        self.scaling = layers[0].self_attn.scaling
        self.eps = final_norm.eps
        self.ops: Any = load_native()

    @classmethod
    def build(cls, layers: list[Any], final_norm: RMSNorm) -> NativeLayerStack | None:
        """The stack of these layers, or None unless the op computes exactly what their
        modules compute."""
        supported = (
            len(layers) > 0
            and load_native() is not None
            and all(_plain_layer(layer) for layer in layers)
            and all(norm.eps == final_norm.eps for layer in layers for norm in _norms(layer))
        )
        return cls(layers, final_norm) if supported else None

    def can_run(self, hidden: torch.Tensor, batch: ForwardBatch) -> bool:
        """Whether this step takes the op: where the modules would call the same native ops."""
        return native_step(hidden, batch, self.weight_dtypes, self.quantized)

    def __call__(
        self, hidden: torch.Tensor, rope: Rope, sliding: Rope, batch: ForwardBatch
    ) -> torch.Tensor:  # embeddings [T, hidden] -> the final norm's output [T, hidden]
        cos, sin = rope  # every layer's (the plain layers have no window)
        meta = batch.attn_metadata
        assert isinstance(meta, TorchAttentionMetadata) and meta.native is not None
        plan = meta.native
        pool = batch.kv_pool
        return self.ops.decoder_layers(  # type: ignore[no-any-return]
            hidden, cos, sin, self.weights, self.kinds, self.dense_copies, self.copy_scales,
            self.biases,
            pool.k_buffer, pool.v_buffer,
            batch.out_cache_loc, plan.qo_indptr, plan.kv_indptr, plan.kv_indices,
            [c.rows for c in plan.cascades], [c.prefix_slots for c in plan.cascades],
            self.num_heads, self.eps, self.scaling,
            DENSE_FROM_ROWS, self.copy_from_rows, self.int8_rows,
        )  # fmt: skip


def native_step(
    hidden: torch.Tensor, batch: ForwardBatch, weight_dtypes: set[torch.dtype], quantized: bool
) -> bool:
    """Whether a step can take a native stack: on the CPU outside torch.compile, the torch
    backend's native plan, the pool in the activations' dtype, the dense weights too."""
    meta = batch.attn_metadata
    if (
        hidden.device.type != "cpu"
        or torch.compiler.is_compiling()
        or not isinstance(meta, TorchAttentionMetadata)
        or meta.native is None
        or type(batch.kv_pool) is not KVPool
    ):
        return False
    k_cache, v_cache = batch.kv_pool.get_kv(0)
    return (
        (not quantized or hidden.dtype in (torch.float32, torch.bfloat16))
        and weight_dtypes <= {hidden.dtype}
        and hidden.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and k_cache.dtype == v_cache.dtype == hidden.dtype
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and k_cache.shape[-1] % 2 == 0
        and batch.out_cache_loc.dtype == torch.int64
        and batch.out_cache_loc.is_contiguous()
    )


def _projections(layer: DecoderLayer) -> tuple[PackableLinear, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    assert isinstance(mlp, GatedMLP)  # build() took only plain layers
    return (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)


def _norms(layer: DecoderLayer) -> tuple[RMSNorm, RMSNorm]:
    return layer.input_layernorm, layer.post_attention_layernorm


def _plain_layer(layer: Any) -> bool:
    # Exact types: a subclass may change what happens between the ops (Qwen3's q/k norm).
    if type(layer) is not DecoderLayer or type(layer.self_attn) is not RotaryAttention:
        return False
    if type(layer.mlp) is not GatedMLP or layer.mlp.act != "silu" or layer.self_attn.window:
        return False
    if not layer.self_attn.rotary:  # the op rotates every layer's q and k
        return False
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    one_rank = attn.o_proj.group.size == 1 and mlp.down_proj.group.size == 1
    return one_rank and all(plain_projection(p) for p in projections)


def plain_projection(p: PackableLinear) -> bool:
    if p.packed is None:
        return p.weight is not None
    return bool(p.packed.native)


def weight_of(p: PackableLinear) -> torch.Tensor:
    return p.weight if p.packed is None else p.packed.packed


def dense_copy(p: PackableLinear, attribute: str) -> torch.Tensor:
    copy = None if p.packed is None else getattr(p.packed, attribute)
    return torch.empty(0) if copy is None else copy


def kind_of(p: PackableLinear) -> int:
    return DENSE if p.packed is None else p.packed.kind
