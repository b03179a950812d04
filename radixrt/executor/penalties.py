"""Logit penalties of one decode step, batched over the requests of a batch.

Semantics (B = batch rows, V = vocab):
- frequency / presence (OpenAI): over the OUTPUT tokens so far,
  logits -= frequency * count + presence * (count > 0).
- repetition (CTRL / Hugging Face): over prompt + output tokens, a positive logit is divided by
  the penalty and a negative one multiplied by it.
- logit_bias: added to the listed token ids.
- min_new_tokens: until a request has that many output tokens, its EOS ids and stop_token_ids
  are set to -inf.
The state is rebuilt from the token lists every step (simple, and correct after preemption or
retraction); nothing is built for a penalty no request in the batch uses.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from radixrt.protocol.sampling_params import SamplingParams


@dataclass
class PenaltyState:
    """What `apply` needs; each part is None when no row of the batch uses it. A part's fields
    are set together, by one `_add_*` builder: frequency, presence and output_counts;
    repetition and seen; the three bias_*; the two mask_*."""

    frequency: torch.Tensor | None = None  # [B, 1] float32
    presence: torch.Tensor | None = None  # [B, 1] float32
    output_counts: torch.Tensor | None = None  # [B, V] float32, occurrences in the output
    # The repetition penalty's (row, token) pairs: each token a penalized row's prompt or
    # output holds, once, as the flat index row * V + token, and that row's penalty. Pairs,
    # not a [B, V] mask: a 262k vocabulary made two passes over the mask 12 ms at batch 16.
    repetition: torch.Tensor | None = None  # [S] float32
    seen: torch.Tensor | None = None  # [S] int64
    bias_rows: torch.Tensor | None = None  # [K] int64
    bias_cols: torch.Tensor | None = None  # [K] int64
    bias_values: torch.Tensor | None = None  # [K] float32
    mask_rows: torch.Tensor | None = None  # [M] int64, (row, token) pairs forced to -inf
    mask_cols: torch.Tensor | None = None  # [M] int64

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def apply(self, logits: torch.Tensor) -> None:
        """Penalize `logits` [B, V] float32 IN PLACE (callers pass a copy)."""
        if self.seen is not None:
            assert self.repetition is not None
            # Divide positive logits, multiply negative ones: both move toward "less likely".
            flat = logits.view(-1)
            hit = flat[self.seen]
            flat[self.seen] = torch.where(hit > 0, hit / self.repetition, hit * self.repetition)
        if self.output_counts is not None:
            assert self.frequency is not None and self.presence is not None
            logits -= self.frequency * self.output_counts
            logits -= self.presence * (self.output_counts > 0).to(logits.dtype)
        if self.bias_rows is not None:
            assert self.bias_cols is not None and self.bias_values is not None
            logits.index_put_((self.bias_rows, self.bias_cols), self.bias_values, accumulate=True)
        if self.mask_rows is not None:
            assert self.mask_cols is not None
            logits[self.mask_rows, self.mask_cols] = float("-inf")


def token_counts(
    seqs: Sequence[Sequence[int]], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """Count each token id of each sequence: [B, V] float32, built with one scatter_add.

    The ragged sequences are flattened rather than padded to [B, L]: the flat index
    row * V + token addresses the counts directly, and no padding is built or scattered.
    """
    counts = torch.zeros(len(seqs), vocab_size, dtype=torch.float32, device=device)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64, device=device)
    tokens = torch.tensor(list(itertools.chain.from_iterable(seqs)), dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(seqs), device=device), lengths)
    flat_index = rows * vocab_size + tokens.to(device)
    counts.view(-1).scatter_add_(0, flat_index, torch.ones_like(flat_index, dtype=counts.dtype))
    return counts


def build_penalties(
    params: Sequence[SamplingParams],
    output_ids: Sequence[Sequence[int]],
    prompt_ids: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device | str,
    eos_token_ids: Sequence[int] = (),
) -> PenaltyState | None:
    """The penalty state of one step, or None when no request uses any penalty."""
    state = PenaltyState()
    _add_frequency_presence(state, params, output_ids, vocab_size, device)
    _add_repetition(state, params, output_ids, prompt_ids, vocab_size, device)
    _add_logit_bias(state, params, device)
    _add_min_tokens_mask(state, params, output_ids, eos_token_ids, device)
    return None if state.is_empty() else state


def _column(values: list[float], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)  # [B, 1]


def _add_frequency_presence(
    state: PenaltyState,
    params: Sequence[SamplingParams],
    output_ids: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device | str,
) -> None:
    if not any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params):
        return
    state.frequency = _column([p.frequency_penalty for p in params], device)
    state.presence = _column([p.presence_penalty for p in params], device)
    state.output_counts = token_counts(output_ids, vocab_size, device)


def _add_repetition(
    state: PenaltyState,
    params: Sequence[SamplingParams],
    output_ids: Sequence[Sequence[int]],
    prompt_ids: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device | str,
) -> None:
    rows = [row for row, p in enumerate(params) if p.repetition_penalty != 1.0]
    if not rows:
        return
    seqs = [list(prompt_ids[row]) + list(output_ids[row]) for row in rows]
    tokens = torch.tensor(list(itertools.chain.from_iterable(seqs)), dtype=torch.int64)
    lengths = torch.tensor([len(seq) for seq in seqs], dtype=torch.int64)
    row_of = torch.repeat_interleave(torch.tensor(rows, dtype=torch.int64), lengths)
    state.seen = torch.unique(row_of * vocab_size + tokens).to(device)  # sorted, each once
    penalties = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32)
    state.repetition = penalties.to(device)[state.seen // vocab_size]


def _add_logit_bias(
    state: PenaltyState, params: Sequence[SamplingParams], device: torch.device | str
) -> None:
    rows, cols, values = [], [], []
    for row, p in enumerate(params):
        for token, bias in (p.logit_bias or {}).items():
            rows.append(row)
            cols.append(int(token))
            values.append(float(bias))
    if not rows:
        return
    state.bias_rows = torch.tensor(rows, dtype=torch.int64, device=device)
    state.bias_cols = torch.tensor(cols, dtype=torch.int64, device=device)
    state.bias_values = torch.tensor(values, dtype=torch.float32, device=device)


def _add_min_tokens_mask(
    state: PenaltyState,
    params: Sequence[SamplingParams],
    output_ids: Sequence[Sequence[int]],
    eos_token_ids: Sequence[int],
    device: torch.device | str,
) -> None:
    rows, cols = [], []
    for row, (p, out) in enumerate(zip(params, output_ids, strict=True)):
        if len(out) >= p.min_new_tokens:
            continue
        banned = set(eos_token_ids) | set(p.stop_token_ids or [])
        rows.extend([row] * len(banned))
        cols.extend(sorted(banned))
    if not rows:
        return
    state.mask_rows = torch.tensor(rows, dtype=torch.int64, device=device)
    state.mask_cols = torch.tensor(cols, dtype=torch.int64, device=device)
