"""The interface between a model architecture and the executor.

The model runner and the CUDA graph runner call exactly `model(input_ids, positions, batch)` and
`model.compute_logits(hidden_rows)`; the loader calls `config_from_hf`, the constructor (on the
meta device, with the rank's tensor-parallel group) and `load_weights`. An architecture
registers its class in models/registry.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixrt.distributed import TPGroup
from radixrt.layers.config import TransformerConfig
from radixrt.layers.sharding import CheckpointTensor

if TYPE_CHECKING:
    from radixrt.attention.forward_batch import ForwardBatch

# (Hugging Face name, tensor): a torch.Tensor, or a LazyTensor a sharded model reads part of.
Weights = Iterable[tuple[str, CheckpointTensor]]


class CausalLM(nn.Module, ABC):
    """A causal language model over the paged KV pool, built from a `TransformerConfig` for one
    rank of `tp_group` (TPGroup.single() unless tensor-parallel)."""

    config: TransformerConfig
    tp_group: TPGroup
    # Whether forward may be captured in a CUDA graph or compiled whole (fullgraph): False
    # where a step decides on the host what runs (a mixture of experts' routing).
    static_graphs: bool = True

    @property
    def num_local_kv_heads(self) -> int:
        """KV heads of this rank's layers: what its KV pool must hold per layer and token."""
        return self.config.local_kv_heads(self.tp_group.size)

    @classmethod
    @abstractmethod
    def config_from_hf(cls, hf_config: Any) -> TransformerConfig:
        """The typed config of a Hugging Face config of this architecture.

        Raises ValueError, naming the field, for a setting the model can't honour.
        """

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """input_ids [T], positions [T] -> hidden states [T, hidden] after the final norm.

        Writes each layer's K/V of the new tokens into `batch.kv_pool` through
        `batch.attn_backend`; calls `batch.attn_backend.init_forward_metadata(batch)` itself when
        `batch.attn_metadata` is None (the runner may have done it, e.g. for a CUDA graph).
        """

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] (any rows of forward's output) -> logits [N, vocab] float32."""

    @abstractmethod
    def load_weights(self, weights: Weights) -> None:
        """Fill every parameter from (Hugging Face name, tensor) pairs, cast to the parameter's
        dtype and device. Raises ValueError for an unknown name, a shape mismatch, or parameters
        the weights leave unset."""
