"""The model's check of a jump-forward proposal (see radixrt/grammar/jump_forward.py).

A request carrying k proposed tokens is computed as one extend; its last k+1 logit rows predict
each proposed token and the token after them. Row i is masked by the grammar in the state
after proposals 0..i-1, then all rows are sampled at once with the request's own parameters
(greedy rows take the argmax). Proposal i stands if row i picked it; at the first row that
picked something else, that token replaces it and the later proposals are dropped (their K/V
too). Drawing from the model and keeping the draw when it equals the proposal is exactly
sampling from the model: the output does not depend on whether jump-forward is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from radixrt.errors import RequestFailed
from radixrt.executor.sampler import NO_TOKEN, SamplingBatch, sample
from radixrt.scheduler.req import Req


def verify_proposal(
    req: Req,
    logits: torch.Tensor,
    grammar: Any,
    vocab_size: int,
    eos_token_ids: list[int],
    truncate_kv: Callable[[Req, int], None],
) -> tuple[int, int]:
    """`logits` [k+1, vocab]: rows for the last k proposals and the token after. Settles the
    proposal in req.output_ids and the matcher; returns (the new token, proposals kept).
    RequestFailed if no token may follow the kept proposal (the request cannot go on)."""
    k = logits.shape[0] - 1
    state = req.grammar
    assert state is not None and k == state.unverified, (k, req.num_unverified)
    out, matcher = req.output_ids, state.matcher
    first = len(out) - k  # index of the first proposal
    matcher.rollback(k)
    masks = _masks_along(grammar, matcher, out[first:], logits.shape[0])
    grammar.xgr.apply_token_bitmask_inplace(logits, masks.to(logits.device))
    batch = SamplingBatch.build(
        [req.sampling_params] * (k + 1),
        [req.generator] * (k + 1),
        [out[: first + i] for i in range(k + 1)],
        [req.origin_input_ids] * (k + 1),
        vocab_size,
        logits.device,
        eos_token_ids=eos_token_ids,
    )
    picks = sample(logits, batch).tolist()
    kept = 0
    while kept < k and picks[kept] == out[first + kept]:
        kept += 1
    dropped = k - kept
    if dropped:
        matcher.rollback(dropped)  # it stood after the whole proposal (_masks_along)
        del out[len(out) - dropped :]
        truncate_kv(req, req.kv_len - dropped)
    state.unverified = 0
    if picks[kept] == NO_TOKEN:  # the kept proposal stands; nothing may follow it
        raise RequestFailed(req.no_token_message(bool(torch.isfinite(logits[kept]).any())))
    out.append(picks[kept])
    return picks[kept], kept


def _masks_along(grammar: Any, matcher: Any, proposal: list[int], rows: int) -> torch.Tensor:
    """Bitmasks [rows, words]: row i in the matcher state after proposal[:i]. Leaves the
    matcher after the whole proposal."""
    masks: torch.Tensor = grammar.xgr.allocate_token_bitmask(rows, grammar.vocab_size)
    for i in range(rows):
        matcher.fill_next_token_bitmask(masks, i)
        if i < len(proposal):
            accepted = matcher.accept_token(proposal[i])
            assert accepted, "a proposal the matcher took once must be taken again"
    return masks
