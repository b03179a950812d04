"""The radix cache's per-page block timing (vLLM's kv_block_* histograms), observed through the
cache's observer protocol, with a fake clock."""

from __future__ import annotations

from radixrt.cache.allocator import PageAllocator
from radixrt.cache.block_timings import KVBlockTimings
from radixrt.cache.radix_cache import RadixCache


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def paged_cache(page_size: int = 2, num_pages: int = 16) -> tuple[RadixCache, FakeClock]:
    clock = FakeClock()
    timings = KVBlockTimings(page_size, clock)
    cache = RadixCache(PageAllocator(num_pages, page_size), page_size, timings)
    return cache, clock


def insert(cache: RadixCache, key: list[int]) -> None:
    slots = cache.allocator.alloc_slots(len(key), None)
    assert slots is not None
    present = cache.insert(key, slots)
    cache.allocator.free_slots(slots[:present])


def test_eviction_observes_lifetime_and_idle_time_once_per_page() -> None:
    cache, clock = paged_cache()
    timings = cache.block_timings
    insert(cache, [1, 2, 3, 4, 5, 6])  # 3 pages, born at 100
    clock.now = 103.0
    node = cache.match_prefix([1, 2, 3, 4]).last_node  # splits: [1..4] and [5, 6]
    cache.inc_lock_ref(node)
    clock.now = 105.0
    cache.dec_lock_ref(node)  # [1..4] idle from 105
    clock.now = 110.0
    assert cache.evict(6).tokens == 6
    # Every page lived 10 s; the two pages a request held idled 5 s, the other one 10 s.
    assert timings.lifetime.total == 3 and timings.lifetime.sum == 30
    assert timings.idle_before_evict.total == 3 and timings.idle_before_evict.sum == 5 * 2 + 10
    assert timings.evicted_tokens == 6
    assert timings.reuse_gap.total == 0  # taken once, never again


def test_reuse_gap_is_release_to_next_take_and_ignores_the_first_take() -> None:
    cache, clock = paged_cache()
    insert(cache, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)  # first use: no gap
    clock.now = 101.0
    cache.dec_lock_ref(node)
    clock.now = 104.0
    cache.inc_lock_ref(node)  # a second request, 3 s after the first let go
    cache.inc_lock_ref(node)  # a third, while it is still held: not a reuse of idle pages
    gaps = cache.block_timings.reuse_gap
    assert gaps.total == 2 and gaps.sum == 3 * 2  # two pages, 3 s each


def test_a_split_keeps_birth_and_release_times_on_both_halves() -> None:
    cache, clock = paged_cache()
    insert(cache, [1, 2, 3, 4])  # born at 100
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    clock.now = 102.0
    cache.dec_lock_ref(node)  # idle from 102
    clock.now = 106.0
    cache.match_prefix([1, 2, 9, 9])  # splits [1..4] into [1, 2] + [3, 4]
    cache.evict(4)
    timings = cache.block_timings
    assert timings.lifetime.total == 2 and timings.lifetime.sum == 6 * 2
    assert timings.idle_before_evict.sum == 4 * 2


def test_flush_counts_every_cached_page_as_evicted() -> None:
    cache, clock = paged_cache(page_size=1)
    insert(cache, [1, 2, 3])
    insert(cache, [1, 2, 9])  # splits [1, 2]; the upper node keeps its birth time
    clock.now = 107.0
    dropped = cache.reset()
    lifetime = cache.block_timings.lifetime
    assert lifetime.total == 4 and lifetime.sum == 4 * 7
    assert cache.block_timings.evicted_tokens == 4
    assert cache.total_size() == 0 and dropped.tokens == 4


def test_the_timings_forget_dropped_nodes() -> None:
    """Stamps live as long as their node: a long-running server does not grow them."""
    cache, _ = paged_cache()
    for first in range(4):
        insert(cache, [first, 0, 1, 1])
    cache.evict(4)
    insert(cache, [9, 9])
    cache.reset()
    assert not cache.block_timings._born and not cache.block_timings._released
