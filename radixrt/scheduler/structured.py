"""Structured generation as the scheduler sees it: one object called at three points.

- admit: `submit` starts compiling a constrained request's grammar (off the step loop) and
  holds the request; `take_compiled` hands back those whose grammar is ready (a matcher
  attached) and those that cannot run (it did not compile in time, or admits no token).
- mask: `mask` forbids, in each constrained row of a step's logits, what its grammar forbids
  (for a request with drafts, row j in the state after drafts 0..j-1).
- accept / draft: `accept` advances the matcher by a kept token (ending the request when the
  grammar is complete); `propose` appends a jump-forward proposal and `take_draft` the part of
  a speculative draft the grammar allows, both unchecked (the matcher takes them; the next
  step's rows settle them, scheduler/draft_rows.py; `Req.drop_unverified` rolls them back).

Everything per request lives in its `GrammarState` (`req.grammar`); an unconstrained request
has None there and is never seen here.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from radixrt.errors import RequestFailed
from radixrt.grammar.constraint import constraint_of
from radixrt.grammar.jump_forward import propose
from radixrt.scheduler.req import GrammarState, Req
from radixrt.scheduler.stats import SchedulerStats

if TYPE_CHECKING:
    from radixrt.grammar.backend import GrammarBackend


@dataclass(frozen=True)
class Compiled:
    """What `take_compiled` found: requests ready to schedule, and (request, why) for those
    that end here."""

    ready: list[Req]
    failed: list[tuple[Req, str]]


class StructuredGeneration:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: list[int],
        compile_timeout_s: float,
        jump_forward: bool = True,
        json_any_whitespace: bool = False,
        stats: SchedulerStats | None = None,
    ) -> None:
        """`stats` (the scheduler's; its own if None) counts compile times."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.compile_timeout_s = compile_timeout_s
        self.jump_forward = jump_forward
        self.json_any_whitespace = json_any_whitespace
        self.stats = stats if stats is not None else SchedulerStats()
        self.compiling: list[tuple[Req, Future[Any]]] = []
        self._submitted_at: dict[int, float] = {}  # id(req) -> monotonic time of submit
        self._backend: GrammarBackend | None = None  # made at the first constraint

    # -- admit ------------------------------------------------------------------------------
    def submit(self, req: Req) -> bool:
        """Start compiling the request's constraint and hold the request; False (nothing
        done) if it has none."""
        constraint = constraint_of(req.sampling_params)
        if constraint is None:
            return False
        self.compiling.append((req, self.backend.compile(*constraint)))
        self._submitted_at[id(req)] = time.monotonic()
        return True

    def take_compiled(self) -> Compiled:
        """The held requests whose compile has ended (or run past the timeout, counted from
        its start), with their matchers attached, or with why they cannot run."""
        ready, failed = [], []
        now = time.monotonic()
        for item in list(self.compiling):
            req, future = item
            started = getattr(future, "started_at", None)
            late = started is not None and now - started > self.compile_timeout_s
            if not future.done() and not late:
                continue
            self.compiling.remove(item)
            self.stats.grammar_compile_time.observe(now - self._submitted_at.pop(id(req), now))
            try:
                req.grammar = self._state_of(req, future)
            except Exception as e:  # noqa: BLE001 - xgrammar's errors end this request only
                failed.append((req, str(e)))
                continue
            ready.append(req)
        return Compiled(ready, failed)

    def cancel(self, rid: str) -> list[Req]:
        """Stop holding the requests of `rid` (aborted while compiling); returns them."""
        gone = [item for item in self.compiling if item[0].rid == rid]
        for item in gone:
            self.compiling.remove(item)
            self._submitted_at.pop(id(item[0]), None)
            item[1].cancel()
        return [req for req, _ in gone]

    @property
    def backend(self) -> GrammarBackend:
        if self._backend is None:
            from radixrt.grammar.backend import GrammarBackend

            self._backend = GrammarBackend(
                self.tokenizer, self.vocab_size, self.json_any_whitespace
            )
        return self._backend

    def _state_of(self, req: Req, future: Future[Any]) -> GrammarState:
        """The matcher of a compiled constraint; RequestFailed saying why there is none."""
        found = constraint_of(req.sampling_params)
        assert found is not None
        kind = found[0]
        if not future.done():
            raise RequestFailed(
                f"sampling param {kind!r} did not compile within "
                f"{self.compile_timeout_s:g} s (the server's "
                "--grammar-compile-timeout): simplify it"
            )
        if future.exception() is not None:
            raise RequestFailed(f"the constraint did not compile: {future.exception()}")
        if not self.backend.allows_some_token(future.result()):
            raise RequestFailed(
                f"sampling param {kind!r} can never be satisfied: no token of "
                "this model's vocabulary can start a text it accepts"
            )
        return GrammarState(kind, self.backend.matcher(future.result()))

    # -- mask -------------------------------------------------------------------------------
    def mask(
        self, reqs: list[Req], drafts: list[int], logits: torch.Tensor, guard: Callable[..., bool]
    ) -> None:
        """Mask, in place, each constrained request's rows of `logits` ([sum(k + 1), vocab]:
        k + 1 rows for a request with k drafts, in order) by its grammar, with one bitmask for
        the step. Row j of a request is masked in the state after its drafts 0..j-1; its
        matcher ends where it began. `guard(req, doing, fn, *args)` runs a request's fill and
        fails that request alone if it raises."""
        starts = list(itertools.accumulate((k + 1 for k in drafts), initial=0))
        constrained = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not constrained:
            return
        bitmask = self.backend.new_bitmask(logits.shape[0])
        filled: list[int] = []
        for i in constrained:
            req, k, start = reqs[i], drafts[i], starts[i]
            if guard(req, "filling its grammar's mask", _fill_along, req, k, bitmask, start):
                filled.extend(range(start, start + k + 1))
        self.backend.apply_bitmask(logits, bitmask, filled)

    # -- accept / rollback ------------------------------------------------------------------
    def accept(self, req: Req, tok: int) -> None:
        """The matcher takes `tok` (already the last of req.output_ids); the request ends
        when its grammar is complete. RequestFailed if the matcher refuses it."""
        state = req.grammar
        assert state is not None
        if not state.matcher.accept_token(tok):
            req.output_ids.pop()
            raise RequestFailed(
                f"the grammar of the request refused token {tok}, which its own mask allowed"
            )
        if state.matcher.is_terminated():
            req.finish_reason = {"type": "stop", "matched": tok}

    def propose(self, req: Req) -> None:
        """Append the tokens the grammar now forces (jump-forward), unchecked: the next step
        computes them and its rows settle them."""
        state = req.grammar
        if state is None or req.finished or not self.jump_forward:
            return
        # Room for the proposal and the token sampled after it.
        proposal = propose(state.matcher, self.tokenizer, req.remaining_new_tokens - 1)
        req.output_ids.extend(proposal)
        req.unverified, req.draft_kind = len(proposal), "jump"

    def allowed_prefix(self, req: Req, draft: list[int]) -> list[int]:
        """The leading part of `draft` the request's grammar accepts, which its matcher has
        now taken (up to where the grammar would end)."""
        state = req.grammar
        assert state is not None
        taken: list[int] = []
        for tok in draft:
            if state.matcher.is_terminated() or not state.matcher.accept_token(tok):
                break
            taken.append(tok)
        return taken

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()


def _fill_along(req: Req, k: int, bitmask: torch.Tensor, start: int) -> None:
    """Rows start..start+k of `bitmask`: row j in the matcher's state after the request's
    drafts 0..j-1 (the last k ids of its output). The matcher ends where it began (after
    them)."""
    state = req.grammar
    assert state is not None
    matcher, drafts = state.matcher, req.output_ids[len(req.output_ids) - k :]
    matcher.rollback(k)
    for j in range(k + 1):
        matcher.fill_next_token_bitmask(bitmask, start + j)
        if j < k:
            accepted = matcher.accept_token(drafts[j])
            assert accepted, "a draft the matcher took once must be taken again"
