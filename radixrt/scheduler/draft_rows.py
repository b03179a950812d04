"""Sampling a step's rows when some requests carry drafts, and which drafts stand.

A request with k drafted tokens (a jump-forward proposal or a speculative draft) has k + 1
logit rows: row j predicts draft j, row k the token after them. Every row is drawn with the
request's own parameters, penalties counting the tokens before that row, so row j is drawn
exactly as a step without drafts would draw that position. Draft j stands while rows 0..j
drew the drafts themselves; the first row that drew something else gives the next token.

This is the rejection rule of speculative sampling for a draft proposed with certainty: the
draft survives with the model's probability of it, and otherwise the token comes from the
model with the draft removed and renormalized (the draw, given it is not the draft). Greedy
rows take the argmax, so greedy output is the same token for token.

A seeded request draws from its own generator row after row. Rows past the first rejection
are drawn in the same call but are not used, so the generator is put back and only the rows
used are drawn again: the request's tokens are then the same as without drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixrt.executor.sampler import SamplingBatch, sample
from radixrt.scheduler.req import Req


def row_spans(drafts: Sequence[int]) -> list[tuple[int, int]]:
    """(first row, rows) of each request in the flattened rows: k drafts take k + 1 rows."""
    spans, start = [], 0
    for k in drafts:
        spans.append((start, k + 1))
        start += k + 1
    return spans


def kept_drafts(picks: Sequence[int], drafts: Sequence[int]) -> int:
    """How many leading drafts the rows' picks confirm."""
    kept = 0
    while kept < len(drafts) and picks[kept] == drafts[kept]:
        kept += 1
    return kept


def sample_rows(
    reqs: Sequence[Req],
    drafts: Sequence[int],
    logits: torch.Tensor,
    vocab_size: int,
    eos_token_ids: list[int],
) -> list[int]:
    """The pick of every row of logits [sum(k + 1), V] (requests' rows in order, drafts at the
    end of each one's output_ids), in one batched draw; seeded requests' generators end as if
    only the rows up to their first rejection had been drawn."""
    spans = row_spans(drafts)
    saved = {
        i: req.generator.get_state()
        for i, req in enumerate(reqs)
        if drafts[i] and req.generator is not None and not req.sampling_params.is_greedy
    }
    picks: list[int] = sample(
        logits, _batch(reqs, drafts, logits.device, vocab_size, eos_token_ids)
    ).tolist()
    for i, state in saved.items():
        start, n = spans[i]
        req, k = reqs[i], drafts[i]
        used = kept_drafts(picks[start : start + k], req.output_ids[-k:]) + 1
        if used == n:
            continue
        generator = req.generator
        assert generator is not None
        generator.set_state(state)
        again = sample(
            logits[start : start + used],
            _batch([req], [used - 1], logits.device, vocab_size, eos_token_ids, drafted=k),
        )
        picks[start : start + used] = again.tolist()
    return picks


def _batch(
    reqs: Sequence[Req],
    drafts: Sequence[int],
    device: torch.device,
    vocab_size: int,
    eos_token_ids: list[int],
    drafted: int | None = None,
) -> SamplingBatch:
    """One row per (request, row): row j of a request with k drafts sees its output before
    draft j. `drafted`: the drafts at the end of output_ids when fewer rows are drawn."""
    params, generators, outputs, prompts = [], [], [], []
    for req, k in zip(reqs, drafts, strict=True):
        out = req.output_ids
        first = len(out) - (k if drafted is None else drafted)
        for j in range(k + 1):
            params.append(req.sampling_params)
            generators.append(req.generator)
            outputs.append(out if first + j == len(out) else out[: first + j])
            prompts.append(req.origin_input_ids)
    return SamplingBatch.build(
        params, generators, outputs, prompts, vocab_size, device, eos_token_ids=eos_token_ids
    )
