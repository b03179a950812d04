"""KVManager: the only owner that takes and frees pages; admission is a dry run (`fits`) and
then a commit (`admit`) that cannot fail, so a refused request leaves nothing behind."""

from __future__ import annotations

import pytest

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import create_prefix_cache
from radixrt.cache.invariants import check_kv_accounting
from radixrt.cache.radix_cache import RadixCache
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.req import Req

A, B, X = 1, 2, 3


def make(num_pages: int = 10, kind: str = "radix") -> KVManager:
    alloc = PageAllocator(num_pages, 1)
    return KVManager(alloc, create_prefix_cache(kind, alloc), ReqToTokenTable(4, 32, "cpu"))


def request(ids: list[int]) -> Req:
    return Req(f"r{ids}", ids, SamplingParams(max_new_tokens=4))


def run_to_end(kv: KVManager, ids: list[int]) -> None:
    """A request that ran its prompt and ended: its pages stay cached, unlocked."""
    req = request(ids)
    match = kv.match(req)
    kv.admit(req, match, len(ids) - req.prefix_match_len)
    req.kv_len = req.num_slots
    kv.release(req)


def state(kv: KVManager) -> tuple[object, ...]:
    assert isinstance(kv.cache, RadixCache)
    alloc = kv.allocator
    stack = alloc._stack[: alloc.num_free_pages].tolist()
    return stack, kv.cache.format_tree(), kv.table.num_free_rows


def test_a_prefix_it_would_lock_does_not_count_as_evictable() -> None:
    """10 pages: [B, B] and [A]*6 cached, 2 free. A request matching [A]*6 that needs 5 more
    would lock those 6, leaving 2 free + 2 evictable: it does not fit, though 10 look free."""
    kv = make()
    run_to_end(kv, [B, B])
    run_to_end(kv, [A] * 6)
    req = request([A] * 6 + [X] * 5)
    match = kv.match(req)
    assert req.prefix_match_len == 6 and kv.available_tokens() == 10
    before = state(kv)
    assert not kv.fits(req, match, 5)
    assert state(kv) == before, "a refused admission changed the pool, the tree or the table"
    assert (req.table_row, req.num_slots, req.last_node) == (-1, 0, None)
    assert kv.cache.match_prefix([B, B]).indices.numel() == 2, "it evicted for nothing"
    check_kv_accounting(kv.allocator, kv.cache, 0)


def test_what_fits_commits_evicting_only_what_it_needs() -> None:
    kv = make()
    run_to_end(kv, [B, B])
    run_to_end(kv, [A] * 6)
    req = request([A] * 6 + [X] * 4)
    match = kv.match(req)
    assert kv.fits(req, match, 4)
    kv.admit(req, match, 4)  # takes the 2 free pages and evicts [B, B]
    assert req.num_slots == 10 and req.tree_len == 6 and kv.allocator.num_free_pages == 0
    assert kv.cache.match_prefix([B, B]).indices.numel() == 0
    check_kv_accounting(kv.allocator, kv.cache, req.private_pages(1))
    kv.release(req)
    kv.flush_cache()
    assert kv.allocator.num_free_pages == 10


def test_without_a_free_table_row_nothing_fits() -> None:
    kv = make(num_pages=32)
    for i in range(kv.table.num_rows):
        req = request([i + 10])
        match = kv.match(req)
        kv.admit(req, match, 1)
    late = request([A])
    assert not kv.fits(late, kv.match(late), 1)


@pytest.mark.parametrize("kind", ["radix", "none"])
def test_everything_comes_back_however_a_request_ends(kind: str) -> None:
    kv = make(kind=kind)
    for publish in (True, False):
        req = request([A, B, X, A])
        match = kv.match(req)
        assert kv.fits(req, match, 4)
        kv.admit(req, match, 4)
        req.kv_len = 4
        kv.release(req, publish=publish)
    kv.flush_cache()
    assert kv.allocator.num_free_pages == 10 and kv.table.num_free_rows == 4
