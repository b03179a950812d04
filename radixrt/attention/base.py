"""The attention backend interface. Backends are chosen by name through `create_backend`."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from radixrt.attention.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """Paged attention over the KV pool.

    Contract: `init_forward_metadata(fb)` runs once per forward before any layer and may store
    what it precomputes in `fb.attn_metadata`. `forward(...)` is called by every attention layer:
    it first writes the new tokens' K/V into the pool at `fb.out_cache_loc` (layer `layer_id`),
    then returns, for every new token, causal attention over its own sequence: the cached prefix
    plus the new tokens up to and including itself. With `window` W > 0 (a sliding-window
    layer) a token at position p sees only the keys at positions p - W + 1 .. p, as
    transformers' sliding-window mask does (key j visible iff p - W < j <= p); 0 sees all.

    A backend that can run decode steps under CUDA graphs sets `supports_cuda_graph` and
    implements `init_graph_metadata`.
    """

    supports_cuda_graph: bool = False

    @abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None: ...

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, num_q_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        layer_id: int,
        fb: ForwardBatch,
        scaling: float,
        window: int = 0,
    ) -> torch.Tensor:  # [T, num_q_heads, head_dim]
        ...

    def init_graph_metadata(self, fb: ForwardBatch) -> None:
        """Like init_forward_metadata, for a decode-only batch captured once in a CUDA graph and
        replayed with other lengths: the metadata may depend on the batch size only, and must
        keep reading fb's (static) index tensors."""
        raise NotImplementedError(f"{type(self).__name__} does not run under CUDA graphs")


# name -> "module:Class", imported lazily so that a backend's dependencies load only when used.
_BACKENDS = {
    "torch": "radixrt.attention.torch_backend:TorchAttentionBackend",
    "triton": "radixrt.attention.triton_backend:TritonAttentionBackend",
}


def create_backend(name: str, **kwargs: object) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(f"attention_backend must be one of {sorted(_BACKENDS)}, got {name!r}")
    module_name, cls_name = _BACKENDS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"attention_backend {name!r} is not available here ({e}); use attention_backend='torch'"
        ) from e
    cls: Callable[..., AttentionBackend] = getattr(module, cls_name)
    return cls(**kwargs)
