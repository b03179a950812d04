"""The decoder forward with everything between two attention calls compiled by torch.compile
(inductor's CPU backend): the per-op overhead of a CPU decode step (norms, rotary, residual
adds, activations: ~2,000 small ops) becomes a few fused kernels per layer.

Attention stays eager: the backend reads Python metadata (lists, dataclasses) built per step.
So a forward is 1 + L compiled calls around L eager attention calls:

    head:   embeddings, cos/sin, layer 0's norm, qkv projection and rotary
    middle: layer i's o_proj, norm + residual, MLP, layer i+1's norm, qkv and rotary (x L-1)
    tail:   the last layer's o_proj, norm, MLP and the final norm

The layers are passed as arguments; with `inline_inbuilt_nn_modules` (torch's default) their
parameters are graph inputs, so the L - 1 middle calls share one graph. Token counts are
dynamic (`mark_dynamic`), so decode batches and prefill chunks of any size reuse the graphs.
Compiled code is cached on disk by inductor (`TORCHINDUCTOR_CACHE_DIR`, set by
`use_disk_cache`): a restart reloads it instead of compiling again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import torch
from torch import nn

from radixrt.layers.attention import RotaryAttention
from radixrt.layers.decoder import DecoderLayer
from radixrt.models.decoder import DecoderModel

if TYPE_CHECKING:
    from radixrt.attention.forward_batch import ForwardBatch
    from radixrt.models.base import CausalLM

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def can_compile(model: CausalLM) -> bool:
    """Whether the model is the shared decoder whose layers this module knows how to split:
    DecoderLayer blocks whose attention keeps RotaryAttention's forward (transform_qk may
    differ, as Qwen3's does), whose steps run the same ops whatever the tokens
    (`static_graphs`)."""
    inner = getattr(model, "model", None)
    if not model.static_graphs or type(inner) is not DecoderModel or len(inner.layers) == 0:
        return False
    if inner.embed_scale is not None or inner.sliding_rotary is not None:
        return False  # the head below takes plain embeddings and one rotary
    if inner.rotary.switch_length is not None:
        return False  # longrope: cos/sin depend on the batch's sequence lengths
    return all(_splittable(layer) for layer in inner.layers)


def _splittable(layer: nn.Module) -> bool:
    if type(layer) is not DecoderLayer or not isinstance(layer.self_attn, RotaryAttention):
        return False
    return type(layer.self_attn).forward is RotaryAttention.forward


def use_disk_cache() -> str:
    """Point inductor's on-disk caches (compiled kernels, FX graphs, AOT autograd graphs) at a
    stable directory unless the user chose one: ~/.cache/radixrt/inductor. Returns it."""
    default = Path.home() / ".cache" / "radixrt" / "inductor"
    cache_dir = os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(default))
    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True
    return cache_dir


def _attention_inputs(
    attn: RotaryAttention, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> QKV:
    # RotaryAttention.forward up to the backend call.
    t = hidden.shape[0]
    qkv = attn.qkv_proj(hidden)
    qk = qkv[:, : attn.q_size + attn.kv_size].view(t, -1, attn.head_dim)
    qk = attn.rotate(attn.transform_qk(qk), cos, sin)
    v = qkv[:, attn.q_size + attn.kv_size :].view(t, attn.num_kv_heads, attn.head_dim)
    return qk[:, : attn.num_heads], qk[:, attn.num_heads :], v


def _after_attention(
    layer: DecoderLayer, attn_out: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # RotaryAttention.forward after the backend call, then the rest of DecoderLayer.forward.
    t = attn_out.shape[0]
    hidden = layer.self_attn.o_proj(attn_out.reshape(t, layer.self_attn.q_size))
    hidden, residual = layer.post_attention_layernorm.add_and_norm(hidden, residual)
    return layer.mlp(hidden), residual


def head(
    model: DecoderModel, layer: DecoderLayer, input_ids: torch.Tensor, positions: torch.Tensor
) -> tuple[QKV, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (q, k, v) of layer 0, residual, cos, sin."""
    hidden = model.embed_tokens(input_ids)
    cos, sin = model.rotary.cos_sin(positions, hidden.dtype)
    normed = layer.input_layernorm(hidden)
    return _attention_inputs(layer.self_attn, normed, cos, sin), hidden, cos, sin


def middle(
    layer: DecoderLayer,
    following: DecoderLayer,
    attn_out: torch.Tensor,
    residual: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[QKV, torch.Tensor]:
    """The end of `layer` and the start of `following`: -> (q, k, v) of `following`, residual."""
    hidden, residual = _after_attention(layer, attn_out, residual)
    normed, residual = following.input_layernorm.add_and_norm(hidden, residual)
    return _attention_inputs(following.self_attn, normed, cos, sin), residual


def tail(
    model: DecoderModel, layer: DecoderLayer, attn_out: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """The end of the last layer and the final norm: -> hidden states [T, hidden]."""
    hidden, residual = _after_attention(layer, attn_out, residual)
    return model.norm.add_and_norm(hidden, residual)[0]


class CompiledDecoderForward:
    """`model(input_ids, positions, batch)` for a `can_compile` model, through the compiled
    head / middle / tail graphs and the eager attention backend."""

    def __init__(self, model: CausalLM) -> None:
        assert can_compile(model), "CompiledDecoderForward needs the shared decoder"
        inner = model.model
        assert isinstance(inner, DecoderModel)
        use_disk_cache()
        self.decoder = inner
        self.layers: list[DecoderLayer] = list(inner.layers)  # type: ignore[arg-type]
        # cos_sin caches inv_freq per device on first use; filled now, the graphs need not
        # guard on (and recompile for) the cache being empty.
        device = inner.norm.weight.device  # the embedding's matrix may be packed blocks
        inner.rotary.cos_sin(torch.zeros(1, dtype=torch.int64, device=device), torch.float32)
        self.head = _compile(head)
        self.middle = _compile(middle)
        self.tail = _compile(tail)

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        if batch.attn_metadata is None:
            batch.attn_backend.init_forward_metadata(batch)
        layers = self.layers
        (q, k, v), residual, cos, sin = self.head(self.decoder, layers[0], input_ids, positions)
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            out = batch.attn_backend.forward(
                q, k, v, attn.layer_id, batch, attn.scaling, attn.window
            )
            out = _canonical_layout(out)
            if i + 1 == len(layers):
                return self.tail(self.decoder, layer, out, residual)
            (q, k, v), residual = self.middle(layer, layers[i + 1], out, residual, cos, sin)
        raise AssertionError("unreachable: the model has layers")

    @torch.inference_mode()
    def warm_up(self, max_tokens: int) -> None:
        """Compile (or load from the disk cache) the graphs before the first request: one for a
        single token (torch specializes size 1) and one for every larger count. Runs the
        graphs on dummy inputs; the KV pool is not touched. Logs the time taken."""
        start = time.monotonic()
        sizes = sorted({1, min(2, max_tokens)})
        first, last = self.layers[0], self.layers[-1]
        device = self.decoder.norm.weight.device
        for n in sizes:
            ids = torch.zeros(n, dtype=torch.int64, device=device)
            positions = torch.arange(n, device=device)  # not `ids`: dynamo guards aliasing
            (q, _, _), residual, cos, sin = self.head(self.decoder, first, ids, positions)
            out = torch.zeros_like(q, memory_format=torch.contiguous_format)
            self.middle(first, self.layers[min(1, len(self.layers) - 1)], out, residual, cos, sin)
            self.tail(self.decoder, last, out, residual)
        logger.info(
            "warm-up: torch.compile graphs for 1..%d tokens ready in %.1f s (cache %s)",
            max_tokens,
            time.monotonic() - start,
            os.environ.get("TORCHINDUCTOR_CACHE_DIR", "torch's default"),
        )


def _canonical_layout(out: torch.Tensor) -> torch.Tensor:
    """Backends return [T, Hq, D] in layouts that vary by path (a transposed SDPA output for
    decodes; with T = 1 any stride counts as contiguous); the graphs guard on strides, so
    they get the one row-major layout (a copy of T * Hq * D values when needed)."""
    if out.stride() == (out.shape[1] * out.shape[2], out.shape[2], 1):
        return out
    return out.clone(memory_format=torch.contiguous_format)


def _compile(fn: Callable[P, R]) -> Callable[P, R]:
    # fullgraph: a graph break here would be a bug (the attention is outside the graphs).
    # dynamic: every token count shares one graph (a size of 1 gets its own: torch specializes
    # sizes 0 and 1); the weights' sizes stay static.
    return torch.compile(fn, fullgraph=True, dynamic=True)
