"""Driving a ModelRunner by hand, as the scheduler would: each sequence is fed its prompt's
tokens, then the tokens it picks greedily (tests of the runner's CPU paths share this)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from radixrt.attention.forward_batch import SimpleStep
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.executor.model_runner import ModelRunner
from radixrt.layers.config import TransformerConfig
from radixrt.models.base import CausalLM

ROW_SLOTS = 512  # table row r owns pool slots r*512 .. (except the shared prefix)
SHARED = 16  # row 3's first 16 slots are row 0's: a prefix-cache hit of row 0's prompt


@dataclass
class Seq:
    """Table row `row`'s sequence: its tokens so far, how many have K/V, what it generated."""

    row: int
    tokens: list[int]
    cached: int = 0
    generated: list[int] = field(default_factory=list)


def cpu_runner(model: CausalLM, cfg: TransformerConfig, **kw: Any) -> ModelRunner:
    """A runner over 8 table rows of ROW_SLOTS slots each, the pool in the model's dtype, the
    torch backend; `kw` goes to ModelRunner (torch.compile settings)."""
    dims = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    pool = KVPool(8 * ROW_SLOTS, *dims, cfg.dtype, "cpu")
    table = ReqToTokenTable(8, ROW_SLOTS, "cpu")
    for row in range(8):
        table.write(row, 0, torch.arange(row * ROW_SLOTS, (row + 1) * ROW_SLOTS))
    table.write(3, 0, torch.arange(SHARED))
    return ModelRunner(model, pool, TorchAttentionBackend(), table, "cpu", **kw)


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(3, 250, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def feed(runner: ModelRunner, work: list[tuple[Seq, int]]) -> torch.Tensor:
    """One step: each sequence's next n tokens; a sequence whose known tokens are all cached
    then takes its last row's argmax. Returns the step's logits, a row per sequence."""
    ids: list[int] = []
    rows: list[int] = []
    for seq, n in work:
        ids += seq.tokens[seq.cached : seq.cached + n]
        rows.append(len(ids) - 1)
    step = SimpleStep(
        [s.row for s, _ in work], [s.cached for s, _ in work], [n for _, n in work], ids, rows
    )
    out = runner.forward(step)
    for (seq, n), row_logits in zip(work, out, strict=True):
        seq.cached += n
        if seq.cached == len(seq.tokens):
            token = int(row_logits.argmax())
            seq.tokens.append(token)
            seq.generated.append(token)
    return out
