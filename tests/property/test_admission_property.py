"""Property test: admission checks, then commits (KVManager.fits, then admit).

A KVManager over a small pool is driven like a scheduler: requests are admitted, grow, publish
between chunks, end, and the cache is flushed. Before each admission the dry run's answer is
compared with what committing would do, tried on a deep copy of the whole KV state: `fits` must
say yes exactly when the commit succeeds. A refusal must leave everything as it was (the
allocator, the tree, its locks and access times, the table, the request), and a yes must commit.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import MatchResult
from radixrt.cache.invariants import check_kv_accounting
from radixrt.cache.radix_cache import RadixCache
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.req import Req

MAX_ROWS = 3
MAX_KEY = 24


def commit_succeeds(kv: KVManager, req: Req, match: MatchResult, n: int) -> bool:
    """Commit on a copy of everything; the real state is not touched."""
    kv, req, match = copy.deepcopy((kv, req, match))
    try:
        kv.admit(req, match, n)
    except AssertionError:  # no free row, or not enough pages
        return False
    return True


def fingerprint(kv: KVManager, req: Req) -> tuple[Any, ...]:
    alloc, cache = kv.allocator, kv.cache
    assert isinstance(cache, RadixCache)
    return (
        alloc.num_free_pages,
        alloc._stack[: alloc.num_free_pages].tolist(),  # which pages come out next
        cache.format_tree(max_tokens=MAX_KEY),  # keys, locks, access times
        cache.block_timings.snapshot(),
        kv.table.num_free_rows,
        (req.table_row, req.num_slots, req.tree_len, req.kv_len, req.last_node),
        req.cached_tokens,
    )


class AdmissionMachine(RuleBasedStateMachine):
    PAGE_SIZE = 1
    NUM_PAGES = 12

    def __init__(self) -> None:
        super().__init__()
        alloc = PageAllocator(self.NUM_PAGES, self.PAGE_SIZE)
        table = ReqToTokenTable(MAX_ROWS, 2 * MAX_KEY, "cpu")
        self.kv = KVManager(alloc, RadixCache(alloc, self.PAGE_SIZE), table)
        self.running: list[Req] = []
        self.refused = self.admitted = 0

    def draw_req(self, data: st.DataObject) -> Req:
        # Three stems, so prompts share prefixes often.
        stem = data.draw(st.sampled_from([[0] * 8, [1, 2] * 4, [3] * 12]))
        cut = data.draw(st.integers(0, len(stem)))
        tail = data.draw(st.lists(st.integers(0, 3), max_size=MAX_KEY - cut))
        ids = (stem[:cut] + tail) or [0]
        return Req(f"r{self.admitted + self.refused}", ids, SamplingParams(max_new_tokens=8))

    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        req = self.draw_req(data)
        match = self.kv.match(req)
        rest = req.seq_len - req.prefix_match_len
        n = data.draw(st.one_of(st.just(rest), st.integers(1, rest)))  # often a whole prompt
        want = commit_succeeds(self.kv, req, match, n)
        before = fingerprint(self.kv, req)
        fits = self.kv.fits(req, match, n)
        assert fingerprint(self.kv, req) == before, "the dry run changed something"
        assert fits == want, f"fits said {fits}, committing would {'' if want else 'not '}work"
        if not fits:
            self.refused += 1
            return
        self.kv.admit(req, match, n)
        req.kv_len = req.num_slots  # as if the step computed them
        self.running.append(req)
        self.admitted += 1

    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        if not self.running:
            return
        req = data.draw(st.sampled_from(self.running))
        n = data.draw(st.integers(1, 5))
        if len(req.fill_ids) + n <= 2 * MAX_KEY and self.kv.alloc(req, n):
            req.output_ids += [0] * n
            req.kv_len = req.num_slots

    @rule(data=st.data())
    def publish_chunk(self, data: st.DataObject) -> None:
        if self.running:
            self.kv.cache_unfinished(data.draw(st.sampled_from(self.running)))

    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        if self.running:
            req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
            self.kv.release(req, publish=data.draw(st.booleans()))

    @rule()
    def flush(self) -> None:
        if not self.running:
            self.kv.flush_cache()
            assert self.kv.allocator.num_free_pages == self.NUM_PAGES

    @invariant()
    def accounting_holds(self) -> None:
        held = sum(r.private_pages(self.PAGE_SIZE) for r in self.running)
        check_kv_accounting(self.kv.allocator, self.kv.cache, held)
        for req in self.running:  # no page table points at a freed page
            slots = self.kv.table.read(req.table_row, 0, req.num_slots)
            assert not self.kv.allocator.is_free[slots // self.PAGE_SIZE].any()

    def teardown(self) -> None:
        for req in self.running:
            self.kv.release(req)
        self.kv.flush_cache()
        assert self.kv.allocator.num_free_pages == self.NUM_PAGES


class PagedAdmissionMachine(AdmissionMachine):
    PAGE_SIZE = 4
    NUM_PAGES = 5


_SETTINGS = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestAdmissionPageSize1 = AdmissionMachine.TestCase
TestAdmissionPageSize1.settings = _SETTINGS
TestAdmissionPageSize4 = PagedAdmissionMachine.TestCase
TestAdmissionPageSize4.settings = _SETTINGS
