"""Beam search as branches over shared pages (docs/beam_search.md).

A beam-search request is one group. Its root request is admitted and prefilled like any other
(chunked, with radix hits); from its last prompt row on, the group's running beams are
ordinary decode requests of the batch, each with its own row of the request-to-token table.
After each step `BeamSearch.process` ranks the beams' candidates (beam_scorer.py) and reshapes
the group: a beam chosen once takes its token in place; a beam chosen c > 1 times first
publishes its computed whole pages to the prefix cache, and c - 1 children lock them there
(shared) and copy only its partial last page (copy on write; nothing with pages of one token);
a beam chosen by none is released at once, its private pages freed. When the scorer is done,
every beam is released (the live ones published to the cache) and the group's n best
hypotheses go out as n outputs. A preempted group starts over from its prompt (planner.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from radixrt.protocol.messages import ReqOutput
from radixrt.scheduler.beam_scorer import BeamScorer, Hypothesis, StepChoice
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.output import detok_params
from radixrt.scheduler.req import Req
from radixrt.scheduler.schedule_batch import LogitRows
from radixrt.scheduler.stats import SchedulerStats
from radixrt.scheduler.stops import stop_string_in


@dataclass
class BeamGroup:
    """One beam-search request: its running beams (the root alone until its prompt is in),
    its scorer, and the rids its n results go out under."""

    root: Req
    out_rids: list[str]
    stop_ids: set[int]
    beams: list[Req] = field(default_factory=list)
    scorer: BeamScorer = field(init=False)

    def __post_init__(self) -> None:
        self.restart()

    @property
    def width(self) -> int:
        width = self.root.sampling_params.beam_width
        assert width is not None and width > 1, "a group is made for beam_width > 1"
        return width

    def restart(self) -> None:
        """From the prompt again (new, or preempted: the caller released every beam)."""
        p = self.root.sampling_params
        self.root.output_ids = []
        self.beams = [self.root]
        self.scorer = BeamScorer(
            self.width,
            len(self.stop_ids),
            self.root.max_new_tokens,
            p.length_penalty,
            p.early_stopping,
        )

    @property
    def forked(self) -> bool:
        """Whether its first step made the beams (before it, the root alone runs)."""
        return self.scorer.generated > 0

    def release(self, kv: KVManager, running: list[Req]) -> None:
        """Every running beam's K/V goes, published to the prefix cache."""
        for beam in self.beams:
            if beam.table_row >= 0:
                kv.release(beam)
            if beam in running:
                running.remove(beam)

    def release_all(self, kv: KVManager, running: list[Req]) -> None:
        """Preempted: every beam's K/V goes (published); the group starts over."""
        self.release(kv, running)
        self.restart()


class BeamSearch:
    """The scheduler's beam groups: makes them, steps them after each forward, ends them."""

    def __init__(
        self,
        kv: KVManager,
        eos_token_ids: list[int],
        stats: SchedulerStats,
        tokenizer: Any = None,
    ) -> None:
        self.kv = kv
        self.eos_token_ids = list(eos_token_ids)
        self.stats = stats
        self.tokenizer = tokenizer
        self.outputs: list[ReqOutput] = []  # results of groups that ended, not yet sent
        self.live = 0  # groups not ended yet: the step loop skips beam search without any

    def adopt(self, req: Req, out_rids: list[str] | None) -> None:
        """Make `req` the root of a new group (its sampling params asked beam_width > 1)."""
        p = req.sampling_params
        stop_ids = set(p.stop_token_ids or ())
        if not p.ignore_eos:
            stop_ids |= set(self.eos_token_ids)
        req.beam = BeamGroup(req, list(out_rids or [req.rid]), stop_ids)
        self.live += 1

    @staticmethod
    def names(req: Req, rid: str) -> bool:
        """Whether `rid` names one of the results of the group `req` is a beam of."""
        return req.beam is not None and rid in req.beam.out_rids

    def abort(self, req: Req, queue: list[Req], running: list[Req]) -> list[str]:
        """End the group `req` belongs to (in `queue`: waiting, or running): every beam's
        K/V goes. Returns the rids of its results, to answer as aborted."""
        group = req.beam
        if queue is running:
            group.release(self.kv, running)
        else:
            queue.remove(req)
        self.live -= 1
        return list(group.out_rids)

    def groups(self, reqs: list[Req]) -> int:
        """How many groups these requests (the running ones) hold."""
        return len({id(r.beam) for r in reqs if r.beam is not None})

    # -- one step ---------------------------------------------------------------------------
    def process(
        self, plan: LogitRows, logits: torch.Tensor, running: list[Req], waiting: list[Req]
    ) -> None:
        """Step every group whose beams all computed their next-token row this step; a group
        that cannot fork for lack of room starts over, at the front of `waiting`."""
        if not self.live:
            return
        rows: dict[int, int] = {}
        groups: dict[int, BeamGroup] = {}
        for req, row in zip(plan.sample_reqs, plan.sample_rows, strict=True):
            if req.beam is not None and not req.finished:
                rows[id(req)] = row  # its position among the logit rows
                groups.setdefault(id(req.beam), req.beam)
        for group in groups.values():
            if all(id(b) in rows for b in group.beams):
                picked = logits[[rows[id(b)] for b in group.beams]]
                if not self._advance(group, picked, running):
                    waiting.insert(0, group.root)

    def _advance(self, group: BeamGroup, logits: torch.Tensor, running: list[Req]) -> bool:
        """One step of the group; False if it had to start over (its root is not running)."""
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        if group.scorer.generated < group.root.sampling_params.min_new_tokens and group.stop_ids:
            log_probs[:, sorted(group.stop_ids)] = -float("inf")
        parents = group.beams
        if not group.forked:  # every beam is the prompt: k copies of the root's row
            parents = [group.root] * group.width
            log_probs = log_probs.expand(group.width, -1)
        choice = group.scorer.step(
            log_probs,
            [b.output_ids for b in parents],
            lambda tokens, t: self._matched_stop(group, tokens, t) is not None,
        )
        if choice.done:
            self._end(group, running)
        elif not self._regroup(group, parents, choice, running):
            group.release_all(self.kv, running)  # no room to fork: start over later
            group.root.num_retractions += 1
            self.stats.num_preemptions += 1
            return False
        return True

    def _matched_stop(self, group: BeamGroup, tokens: list[int], token: int) -> int | str | None:
        """The stop id or stop string `tokens + [token]` ends with, or None; min_new_tokens
        holds both back (as OutputProcessor._check_finished)."""
        params = group.root.sampling_params
        if len(tokens) + 1 < params.min_new_tokens:
            return None
        if token in group.stop_ids:
            return token
        return stop_string_in([*tokens, token], params.stop, self.tokenizer)

    def _regroup(
        self, group: BeamGroup, parents: list[Req], choice: StepChoice, running: list[Req]
    ) -> bool:
        """The k beams of the next step: pruned beams go, then the forks (they copy a parent
        before it takes its token), then each beam's token. False if the forks do not fit
        (the caller starts the group over)."""
        uses = Counter(id(parents[i]) for i in choice.parents)
        forked = [b for b in _unique(parents[i] for i in choice.parents) if uses[id(b)] > 1]
        pruned = [b for b in _unique(group.beams) if id(b) not in uses]
        extra = sum(uses[id(b)] - 1 for b in forked)
        if self.kv.table.num_free_rows + len(pruned) < extra:
            return False
        finished_parents = {id(parents[i]) for i in choice.finished_parents}
        for old in pruned:  # first: their rows and private pages are what the forks take
            self.kv.release(old, publish=id(old) in finished_parents)
            running.remove(old)
        for parent in forked:
            self.kv.cache_unfinished(parent)  # its whole pages: shared through the cache
        if not self.kv.ensure_free(sum((uses[id(b)] - 1) * self.kv.fork_cost(b) for b in forked)):
            return False
        taken: set[int] = set()
        beams: list[Req] = []
        for i in choice.parents:
            parent = parents[i]
            if id(parent) in taken:
                beam = self._fork(parent)
                running.append(beam)
            else:
                taken.add(id(parent))
                beam = parent
            beams.append(beam)
        for beam, token in zip(beams, choice.tokens, strict=True):
            beam.output_ids.append(token)
        group.beams = beams
        return True

    def _fork(self, parent: Req) -> Req:
        child = Req(
            parent.rid,
            parent.origin_input_ids,
            parent.sampling_params,
            arrival_order=parent.arrival_order,
        )
        child.output_ids = list(parent.output_ids)
        child.beam = parent.beam
        child.admitted_at, child.first_token_at = parent.admitted_at, parent.first_token_at
        child.cached_tokens = parent.cached_tokens
        self.stats.beam_shared_tokens += parent.tree_len
        self.stats.beam_copied_tokens += self.kv.fork(parent, child)
        self.stats.beam_forks += 1
        return child

    def _end(self, group: BeamGroup, running: list[Req]) -> None:
        """Release every beam (the live ones published) and queue the n best results."""
        group.release(self.kv, running)
        self.live -= 1
        root = group.root
        results = group.scorer.results(root.sampling_params.n)
        for rid, hyp in zip(group.out_rids, results, strict=True):
            self.outputs.append(self._output(group, rid, hyp))
        self.stats.finished(sum(len(h.tokens) for h in results), root.cached_tokens)

    def _output(self, group: BeamGroup, rid: str, hyp: Hypothesis) -> ReqOutput:
        root, tokens = group.root, hyp.tokens
        matched = self._matched_stop(group, tokens[:-1], tokens[-1])
        reason: dict[str, Any] = {"type": "length", "length": len(tokens)}
        if matched is not None:
            reason = {"type": "stop", "matched": matched}
        return ReqOutput(
            rid=rid,
            new_output_ids=list(tokens),
            finished=True,
            finish_reason=reason,
            prompt_tokens=len(root.origin_input_ids),
            completion_tokens=len(tokens),
            cached_tokens=root.cached_tokens,
            detok=detok_params(root.sampling_params),
            admitted_at=root.admitted_at,
            first_token_at=root.first_token_at,
            beam_score=hyp.score,
            beam_cum_logprob=hyp.cum_logprob,
        )

    def take_outputs(self) -> list[ReqOutput]:
        outputs, self.outputs = self.outputs, []
        return outputs


def _unique(reqs: Iterable[Req]) -> list[Req]:
    """`reqs` without repeats, in order (by identity: a Req is not hashable)."""
    seen: dict[int, Req] = {}
    for req in reqs:
        seen.setdefault(id(req), req)
    return list(seen.values())
