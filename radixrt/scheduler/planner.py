"""Chooses what one step computes: every running decode, continuing prefill chunks, and new
requests admitted within the token budget and the KV that is left (continuous batching)."""

from __future__ import annotations

from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.policy import SchedulePolicy
from radixrt.scheduler.req import Req
from radixrt.scheduler.schedule_batch import ScheduleBatch
from radixrt.scheduler.stats import SchedulerStats

# A waiting request defers one step when a request prefilling now shares at least this many
# more tokens with it than the cache holds (SGLang's in-batch prefix sharing threshold), or its
# whole reusable prompt: next step it finds them cached instead of computing them again.
IN_BATCH_SHARE_THRESHOLD = 32
# Future decode tokens of running requests are reserved at this estimated fraction of their
# max_new_tokens; it rises after a preemption and decays while things go well.
INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY = 0.7, 0.1, 0.001
MAX_RESERVED_PER_REQ = 4096
# The default token budget of a step's prefill. On the CPU, 64 prompts of 128 tokens prefilled
# as four steps of 2,048 took 4.9-5.1 s against 7.4-8.1 s as steps of up to 8,192 (the README's
# Speed on the CPU): a big step's activations are fresh mmaps, faulted in page by page (~480,000
# faults a step), while four steps read the weights only three more times. vLLM's CPU default
# is of the same size (2,048 tokens for its server, 4,096 offline).
GPU_MAX_PREFILL_TOKENS, CPU_MAX_PREFILL_TOKENS = 8192, 2048


def resolve_max_prefill_tokens(asked: int | None, device: str) -> int:
    """The step's prefill budget: `asked`, or the default for `device`."""
    if asked is not None:
        return asked
    return CPU_MAX_PREFILL_TOKENS if device == "cpu" else GPU_MAX_PREFILL_TOKENS


class Planner:
    def __init__(
        self,
        kv: KVManager,
        policy: SchedulePolicy,
        max_prefill_tokens: int,
        chunked_prefill_size: int,
        max_running_requests: int,
        conservativeness: float,
        stats: SchedulerStats,
    ) -> None:
        """`stats`: counts the preemptions."""
        self.kv = kv
        self.policy = policy
        self.max_prefill_tokens = max_prefill_tokens
        self.chunk = chunked_prefill_size if chunked_prefill_size > 0 else 1 << 62
        self.max_running = max_running_requests
        self.conservativeness = conservativeness
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.stats = stats

    def plan(self, running: list[Req], waiting: list[Req]) -> ScheduleBatch:
        """What this step computes, with its slots taken. Mutates `running` and `waiting`:
        admitted requests move to running, retracted ones to the front of waiting."""
        for req in [r for r in running if self.kv.rope_stale(r)]:
            # Grown past LongRoPE's switch length: transformers computes every position with
            # the long frequencies from here on, so its K/V is computed again (docs/longrope.md).
            self._requeue(req, running, waiting)
        decodes, retracted = self._grow_decodes(running, waiting)
        work = [(r, 1 + r.unverified) for r in decodes]
        budget = self.max_prefill_tokens
        for req in [r for r in running if not _is_decode(r)]:
            n = min(req.seq_len - req.kv_len, self.chunk, budget)
            if n <= 0 or not self.kv.alloc(req, n):
                continue
            work.append((req, n))
            budget -= n
        self._admit(running, waiting, budget, work)
        if not work and running:
            # Every running request is a prefill stuck for KV held by the others: retract the
            # newest so the oldest can go on.
            self._retract(max(running, key=lambda r: r.arrival_order), running, waiting)
            retracted = True
        if not retracted:
            self.new_token_ratio = max(
                self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO
            )
        return ScheduleBatch.build(work)

    def _grow_decodes(self, running: list[Req], waiting: list[Req]) -> tuple[list[Req], bool]:
        """Give each decoding request slots for its next token and its drafts; while the pool
        cannot, drop the drafts first, then preempt. Returns the decoding requests left and
        whether any was retracted."""
        retracted = False
        decodes = [r for r in running if _is_decode(r)]
        while decodes and not self.kv.ensure_free(
            sum(self.kv.tokens_needed(r, 1 + r.unverified) for r in decodes)
        ):
            drafted = [r for r in decodes if r.unverified]
            if drafted:
                for req in drafted:
                    req.drop_unverified()
                continue
            victim = min(decodes, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
            self._retract(victim, running, waiting)
            decodes = [r for r in decodes if r in running]  # a beam group goes as a whole
            retracted = True
        for req in decodes:
            allocated = self.kv.alloc(req, 1 + req.unverified)
            assert allocated, "the pool was checked to hold every decode's next slots"
        return decodes, retracted

    def _retract(self, req: Req, running: list[Req], waiting: list[Req]) -> None:
        """Preempt: give up the request's K/V for others', computing it again later."""
        self._requeue(req, running, waiting)
        self.stats.num_preemptions += 1
        self.new_token_ratio = 1.0

    def _requeue(self, req: Req, running: list[Req], waiting: list[Req]) -> None:
        if req.beam is not None:  # every beam goes; the group starts over from its prompt
            req.beam.release_all(self.kv, running)
            req = req.beam.root
        else:
            req.drop_unverified()  # the K/V to check it with is going away
            self.kv.release(req)
            running.remove(req)
        req.num_retractions += 1
        waiting.insert(0, req)

    def reserved_tokens(self, reqs: list[Req]) -> int:
        """The KV that `reqs`' future decode tokens are expected to take."""
        ratio = self.new_token_ratio * self.conservativeness
        return int(
            sum(min(r.remaining_new_tokens, MAX_RESERVED_PER_REQ) * _beams(r) for r in reqs) * ratio
        )

    def _admit(
        self, running: list[Req], waiting: list[Req], budget: int, work: list[tuple[Req, int]]
    ) -> None:
        """Move waiting requests, in the policy's order, to running while budget and KV last."""
        inflight = [r.fill_ids for r in running if r.kv_len < r.seq_len - 1 - r.unverified]
        reserved = self.reserved_tokens(running)
        for req in self.policy.order(waiting):
            if budget <= 0 or len(running) + _beams(req) > self.max_running:
                break
            # Match again even if the policy just did: admitting an earlier request may have
            # evicted part of what that match returned.
            match = self.kv.match(req)
            if self.kv.caches(req) and _should_wait_for_sibling(req, inflight, self.kv.page_size):
                continue
            n = min(req.seq_len - req.prefix_match_len, self.chunk, budget)
            own_reserve = self.reserved_tokens([req])
            if (
                self.kv.available_tokens() < n + reserved + own_reserve + self.kv.page_size
                and running
            ):
                break
            if not self.kv.fits(req, match, n):
                break
            self.kv.admit(req, match, n)
            waiting.remove(req)
            running.append(req)
            inflight.append(req.fill_ids)
            work.append((req, n))
            budget -= n
            reserved += own_reserve


def _beams(req: Req) -> int:
    """The beams a request will run as: a beam group's root before its first step forks it
    runs as beam_width of them."""
    if req.beam is not None and not req.beam.forked:
        return int(req.sampling_params.beam_width or 1)
    return 1


def _is_decode(req: Req) -> bool:
    """Whether the request computes its next token (after its drafts, if it has any)."""
    return bool(req.output_ids) and req.kv_len == req.seq_len - 1 - req.unverified


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
