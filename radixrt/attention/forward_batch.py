"""The flattened description of one model forward over a ragged batch.

A batch mixes prefill chunks ("extend": several new tokens after a cached prefix) and decode
steps (one new token). Every tensor below is built once per step by the model runner; the model
and the attention backend only read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from radixrt.attention.base import AttentionBackend
    from radixrt.cache.kv_pool import KVPool


class StepInput(Protocol):
    """What the model runner reads of a step's batch (the scheduler's ScheduleBatch): sequence
    i computes positions prefix_lens[i] .. + extend_lens[i] - 1 of request-to-token table row
    table_rows[i]; `input_ids` are those positions' tokens, flattened; `logit_rows` the
    flattened rows whose logits the step needs; `rope_lens` each sequence's whole length
    (prompt and output so far: at least prefix + extend; None: prefix + extend), which a
    LongRoPE rotary chooses its frequencies by."""

    @property
    def table_rows(self) -> Sequence[int]: ...
    @property
    def prefix_lens(self) -> Sequence[int]: ...
    @property
    def extend_lens(self) -> Sequence[int]: ...
    @property
    def input_ids(self) -> list[int]: ...
    @property
    def logit_rows(self) -> list[int]: ...
    @property
    def rope_lens(self) -> Sequence[int] | None: ...


@dataclass
class ForwardBatch:
    """T = total new tokens in the batch, B = number of sequences.

    Sequence i owns new tokens qo_indptr[i]:qo_indptr[i+1] of input_ids / positions /
    out_cache_loc, and its whole KV (cached prefix followed by its new tokens) sits at the pool
    slots kv_indices[kv_indptr[i]:kv_indptr[i+1]], in position order.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, position of each new token in its sequence
    out_cache_loc: torch.Tensor  # [T] int64, pool slot that receives each new token's K/V
    qo_indptr: torch.Tensor  # [B+1] int64, offsets of each sequence's new tokens
    kv_indices: torch.Tensor  # [sum(seq_lens)] int64, pool slots of every token of each seq
    kv_indptr: torch.Tensor  # [B+1] int64, offsets into kv_indices
    seq_lens: torch.Tensor  # [B] int64, prefix + new tokens
    extend_lens: torch.Tensor  # [B] int64, new tokens (1 for a decode step)
    # The same three lengths as Python lists: Python control flow must not sync on tensors.
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    kv_pool: KVPool
    attn_backend: AttentionBackend
    # [B] int64: each sequence's whole length, as LongRoPE picks its frequencies by (a prefill
    # chunk's sequence is longer than seq_lens says); None: seq_lens.
    rope_lens: torch.Tensor | None = None
    # Backend-private precomputed data (index tables, masks), set by init_forward_metadata;
    # only the backend that set it knows its type.
    attn_metadata: object = field(default=None)

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.extend_lens_cpu)


@dataclass(frozen=True)
class SimpleStep:
    """A StepInput without a scheduler behind it (benchmarks and runner tests): the table rows
    already hold the slots."""

    table_rows: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    input_ids: list[int]
    logit_rows: list[int]
    rope_lens: list[int] | None = None
