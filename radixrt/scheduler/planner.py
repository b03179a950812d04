"""Chooses what one step computes: every running decode, continuing prefill chunks, and new
requests admitted within the token budget and the KV that is left (continuous batching)."""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.policy import SchedulePolicy
from radixrt.scheduler.req import Req

# A waiting request defers one step when a request prefilling now shares at least this many
# more tokens with it than the cache holds (SGLang's in-batch prefix sharing threshold), or its
# whole reusable prompt: next step it finds them cached instead of computing them again.
IN_BATCH_SHARE_THRESHOLD = 32
# Future decode tokens of running requests are reserved at this estimated fraction of their
# max_new_tokens; it rises after a preemption and decays while things go well.
INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY = 0.7, 0.1, 0.001
MAX_RESERVED_PER_REQ = 4096


@dataclass
class StepPlan:
    work: list[tuple[Req, int]]  # (request, tokens it computes this step)
    admitted: list[Req]
    retracted: list[Req]


class Planner:
    def __init__(
        self,
        kv: KVManager,
        policy: SchedulePolicy,
        max_prefill_tokens: int,
        chunked_prefill_size: int,
        max_running_requests: int,
        conservativeness: float,
    ) -> None:
        self.kv = kv
        self.policy = policy
        self.max_prefill_tokens = max_prefill_tokens
        self.chunk = chunked_prefill_size if chunked_prefill_size > 0 else 1 << 62
        self.max_running = max_running_requests
        self.conservativeness = conservativeness
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.num_preemptions = 0

    def plan(self, running: list[Req], waiting: list[Req]) -> StepPlan:
        """Mutates `running` and `waiting`: admitted requests move to running, retracted ones
        back to the front of waiting."""
        retracted = self._grow_decodes(running, waiting)
        work = [(r, 1) for r in running if _is_decode(r)]
        budget = self.max_prefill_tokens
        for req in [r for r in running if not _is_decode(r)]:
            n = min(req.seq_len - req.kv_len, self.chunk, budget)
            if n <= 0 or not self.kv.alloc(req, n):
                continue
            work.append((req, n))
            budget -= n
        admitted = self._admit(running, waiting, budget, work)
        if not work and running:
            # Every running request is a prefill stuck for KV held by the others: retract the
            # newest so the oldest can go on.
            victim = max(running, key=lambda r: r.arrival_order)
            self._retract(victim, running, waiting)
            retracted.append(victim)
        if not retracted:
            self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY,
                                       MIN_NEW_TOKEN_RATIO)
        return StepPlan(work, admitted, retracted)

    def _grow_decodes(self, running: list[Req], waiting: list[Req]) -> list[Req]:
        """Give each decoding request one more slot; preempt when the pool cannot."""
        retracted: list[Req] = []
        while True:
            decodes = [r for r in running if _is_decode(r)]
            need = sum(self.kv.tokens_needed(r, 1) for r in decodes)
            if self.kv.ensure_free(need) or not decodes:
                break
            victim = min(decodes, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
            self._retract(victim, running, waiting)
            retracted.append(victim)
        for req in [r for r in running if _is_decode(r)]:
            assert self.kv.alloc(req, 1)
        return retracted

    def _retract(self, req: Req, running: list[Req], waiting: list[Req]) -> None:
        self.kv.release(req)
        running.remove(req)
        req.num_retractions += 1
        waiting.insert(0, req)
        self.num_preemptions += 1
        self.new_token_ratio = 1.0

    def _reserved_tokens(self, reqs: list[Req]) -> int:
        ratio = self.new_token_ratio * self.conservativeness
        return int(sum(min(r.remaining_new_tokens, MAX_RESERVED_PER_REQ) for r in reqs) * ratio)

    def _admit(self, running: list[Req], waiting: list[Req], budget: int,
               work: list[tuple[Req, int]]) -> list[Req]:
        admitted: list[Req] = []
        inflight = [r.fill_ids for r in running if r.kv_len < r.seq_len - 1]
        reserved = self._reserved_tokens(running)
        for req in self.policy.order(waiting):
            if budget <= 0 or len(running) >= self.max_running:
                break
            match = self.kv.match(req)
            if _should_wait_for_sibling(req, inflight, self.kv.page_size):
                continue
            n = min(req.seq_len - req.prefix_match_len, self.chunk, budget)
            need = n + reserved + self._reserved_tokens([req]) + self.kv.page_size
            if self.kv.available_tokens() < need and (running or admitted):
                break
            self.kv.admit(req, match)
            if not self.kv.alloc(req, n):
                self.kv.release(req)
                break
            waiting.remove(req)
            running.append(req)
            admitted.append(req)
            inflight.append(req.fill_ids)
            work.append((req, n))
            budget -= n
            reserved += self._reserved_tokens([req])
        return admitted


def _is_decode(req: Req) -> bool:
    return bool(req.output_ids) and req.kv_len == req.seq_len - 1


def _should_wait_for_sibling(req: Req, inflight: list[list[int]], page_size: int) -> bool:
    reusable = req.max_prefix_reuse // page_size * page_size  # the cache holds whole pages
    if not inflight or reusable <= req.prefix_match_len:
        return False
    ids = req.fill_ids
    shared = max(_common_prefix_len(ids, other, reusable) for other in inflight)
    shared = shared // page_size * page_size
    gain = shared - req.prefix_match_len
    return gain >= IN_BATCH_SHARE_THRESHOLD or (gain > 0 and shared >= reusable)


def _common_prefix_len(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on slice equality: C-speed comparisons, log n of them
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
