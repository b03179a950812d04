"""Speculative decoding with n-gram drafts (`--speculative-algorithm NGRAM`), as the scheduler
sees it: after a request takes its tokens, `propose` appends a draft of up to
`speculative_num_draft_tokens - 1` tokens (unchecked, like a jump-forward proposal); the next
step computes them with the token they follow, one extend, and its rows settle them
(scheduler/draft_rows.py, scheduler/output.py); `verified` learns from the outcome.

Where drafts come from, longest first:
- the radix cache: when the request's whole sequence is a path of the tree that goes on (the
  same prompt answered before, a sibling of n > 1, a DSL fork), its continuation along the
  most recently used branch;
- the request itself (prompt lookup, speculative/ngram.py): what followed the last earlier
  occurrence of its tail.
How many: speculative/adaptive.py, from the request's acceptance and the step's cost at the
current batch size. A request that does not draft still scores the draft it would have made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixrt.cache.base import PrefixCache
from radixrt.scheduler.req import Req
from radixrt.scheduler.stats import SchedulerStats
from radixrt.speculative.adaptive import (
    PRIOR_RATE,
    SERVER_WEIGHT,
    Acceptance,
    StepCost,
    draft_size,
)
from radixrt.speculative.ngram import TokenHistory, prompt_lookup

if TYPE_CHECKING:
    from radixrt.scheduler.structured import StructuredGeneration

ALGORITHMS = ("NGRAM",)


# A draft from a tail of at least this many tokens that occurred before (or from the radix
# cache, which matches the whole sequence) is judged by the request's "long" acceptance.
LONG_MATCH = 3
LONG_PRIOR = 0.6  # the long acceptance's rate before any trial (a copy drafts deep at once)


@dataclass
class SpecState:
    """One request's speculation: its verified tokens, its acceptance of drafts from long and
    from short matches, whether its pending draft came from a long one, and the draft it would
    have made at the last step it did not draft (scored against what came next)."""

    history: TokenHistory
    long: Acceptance
    short: Acceptance
    from_long: bool = False
    shadow: list[int] = field(default_factory=list)
    shadow_at: int = 0  # the history's length when the shadow draft was made

    @property
    def acceptance(self) -> Acceptance:
        """The acceptance that judges the pending draft (or shadow)."""
        return self.long if self.from_long else self.short


class Speculator:
    def __init__(
        self,
        cache: PrefixCache,
        num_draft_tokens: int,
        min_window: int,
        max_window: int,
        context_length: int,
        stats: SchedulerStats,
        rope_switch: int | None = None,
    ) -> None:
        """`num_draft_tokens`: SGLang's: positions a request verifies in a step, the token the
        drafts follow included (so at most num_draft_tokens - 1 drafts). `rope_switch`:
        LongRoPE's switch length, which drafts do not cross (docs/longrope.md)."""
        self.cache = cache
        self.max_drafts = num_draft_tokens - 1
        self.min_window, self.max_window = min_window, max_window
        self.context_length = context_length
        self.rope_switch = rope_switch
        self.stats = stats
        self.cost = StepCost()
        self.batch_size = 1  # requests running in the step being planned
        # Every request's verifications, slowly: where a new request's rates start.
        self.server_long = Acceptance(LONG_PRIOR, SERVER_WEIGHT)
        self.server_short = Acceptance(PRIOR_RATE, SERVER_WEIGHT)

    def record_step(self, tokens: int, seconds: float, drafted: bool) -> None:
        """A step of decodes and verifications only: `tokens` query tokens in `seconds`;
        `drafted`: whether any request verified drafts."""
        self.cost.record(tokens, seconds, drafted)

    def verified(self, req: Req, drafted: int, kept: int) -> None:
        """A decode step of the request verified `drafted` drafts (maybe none) and kept
        `kept`."""
        req.spec_verify_ct += 1
        if not drafted:
            return
        req.spec_drafted += drafted
        req.spec_accepted += kept
        self.stats.spec_verified(drafted, kept)
        if req.spec is not None:
            self._record(req.spec, drafted, kept)

    def propose(self, req: Req, structured: StructuredGeneration) -> None:
        """Append the request's draft (unchecked) to its output_ids, if one is worth it."""
        state = self._state_of(req)
        self._score_shadow(state)
        draft, state.from_long = self._draft(req, state)
        if not draft:
            return
        limit = draft_size(self.cost, state.acceptance.rate, len(draft), self.batch_size)
        if limit == 0:
            state.shadow, state.shadow_at = draft, len(state.history)
            return
        draft = draft[:limit]
        if req.grammar is not None:
            draft = structured.allowed_prefix(req, draft)
        req.output_ids.extend(draft)
        req.unverified, req.draft_kind = len(draft), "ngram"

    def _state_of(self, req: Req) -> SpecState:
        """The request's state, its history brought up to its verified tokens."""
        state: SpecState | None = req.spec
        if state is None:
            tokens = TokenHistory(req.origin_input_ids + req.output_ids)
            long, short = Acceptance(self.server_long.rate), Acceptance(self.server_short.rate)
            state = req.spec = SpecState(tokens, long, short)
        have, want = len(state.history), req.seq_len - req.unverified
        if have < want:
            state.history.extend(req.token_slice(have, want))
        elif have > want:  # only a failed accept pops a token, and that request has ended
            state.history.truncate(want)
        return state

    def _score_shadow(self, state: SpecState) -> None:
        """Score the draft not made last step against the tokens that came since."""
        if not state.shadow:
            return
        came = state.history.tokens[state.shadow_at :].tolist()
        compared = state.shadow[: len(came)]
        kept = 0
        while kept < len(compared) and compared[kept] == came[kept]:
            kept += 1
        self._record(state, len(compared), kept)
        state.shadow = []

    def _record(self, state: SpecState, drafted: int, kept: int) -> None:
        state.acceptance.record(drafted, kept)
        (self.server_long if state.from_long else self.server_short).record(drafted, kept)

    def _draft(self, req: Req, state: SpecState) -> tuple[list[int], bool]:
        """The longest draft of either source, cut to the room the request has, and whether
        it comes from a long match."""
        room = self._room(req)
        if room <= 0:
            return [], False
        from_cache = self._from_cache(req, room)
        lookup = prompt_lookup(state.history.tokens, self.min_window, self.max_window, room)
        if from_cache and len(from_cache) >= len(lookup.draft):
            return from_cache, True
        return lookup.draft, lookup.matched >= LONG_MATCH

    def _from_cache(self, req: Req, room: int) -> list[int]:
        """The radix tree's continuation of the request's whole sequence, from the node the
        request holds (its pages' end), if the tree has one."""
        if req.last_node is None:
            return []
        rest = req.token_slice(req.tree_len, req.seq_len)
        return self.cache.continuation(req.last_node, rest, room)

    def _room(self, req: Req) -> int:
        """Drafts the request may take: one token must follow them within max_new_tokens and
        the context, and they do not cross LongRoPE's switch length."""
        room = min(
            self.max_drafts,
            req.remaining_new_tokens - 1,
            self.context_length - req.seq_len - 1,
        )
        if self.rope_switch is not None and req.seq_len <= self.rope_switch:
            room = min(room, self.rope_switch - req.seq_len - 1)
        return room
