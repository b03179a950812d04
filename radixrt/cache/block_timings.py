"""vLLM's kv_block_* histograms: an observer of a prefix cache's nodes (`base.CacheObserver`).

Times are monotonic seconds, kept per node: when it was inserted and when a request last let go
of it. Every page of a node shares those times (a node is inserted whole, a split copies them,
and a match splits the node it ends in, so a lock covers whole nodes): each observation counts
once per page of its node, per-page results at O(1) per node touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from radixrt.observability.histogram import FixedHistogram

if TYPE_CHECKING:
    from radixrt.cache.base import ObservedNode

# KV block times: from a fraction of a second (a page reused by the next request) to an hour.
BLOCK_SECONDS_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class KVBlockTimings:
    """vLLM's kv_block_* histograms, counted per page (vLLM's block) of the cache.

    - lifetime: from the page's insertion into the cache to its eviction;
    - idle before evict: from the last time a request let go of it (or its insertion, if none
      held it since) to its eviction;
    - reuse gap: from a request letting go of it to the next request taking it again.
    Eviction includes a cache flush. `clock` is monotonic seconds (tests pass a fake one).
    """

    def __init__(self, page_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.page_size = page_size
        self.clock = clock
        self.lifetime = FixedHistogram(BLOCK_SECONDS_BUCKETS)
        self.idle_before_evict = FixedHistogram(BLOCK_SECONDS_BUCKETS)
        self.reuse_gap = FixedHistogram(BLOCK_SECONDS_BUCKETS)
        self.evicted_tokens = 0
        self._born: dict[int, float] = {}  # node id -> when it was inserted
        self._released: dict[int, float] = {}  # node id -> when its last holder let go

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {
            "kv_block_lifetime_seconds": self.lifetime.snapshot(),
            "kv_block_idle_before_evict_seconds": self.idle_before_evict.snapshot(),
            "kv_block_reuse_gap_seconds": self.reuse_gap.snapshot(),
        }

    def idle_since(self, node: ObservedNode) -> float:
        """When a request last let go of `node`, or its insertion if none held it since."""
        return self._released.get(node.id, self._born[node.id])

    # ---- CacheObserver ----------------------------------------------------------------------

    def inserted(self, node: ObservedNode) -> None:
        self._born[node.id] = self.clock()

    def split(self, upper: ObservedNode, lower: ObservedNode) -> None:
        self._born[upper.id] = self._born[lower.id]
        if lower.id in self._released:
            self._released[upper.id] = self._released[lower.id]

    def locked(self, nodes: Sequence[ObservedNode]) -> None:
        now = self.clock()
        for node in nodes:
            released = self._released.get(node.id)
            if released is not None:  # taken again after a request let go of it
                self.reuse_gap.observe(now - released, self._pages(node))

    def released(self, nodes: Sequence[ObservedNode]) -> None:
        now = self.clock()
        for node in nodes:
            self._released[node.id] = now

    def evicted(self, nodes: Sequence[ObservedNode]) -> None:
        now = self.clock()
        for node in nodes:
            self._observe_eviction(node, now)
            del self._born[node.id]
            self._released.pop(node.id, None)

    def cleared(self, nodes: Sequence[ObservedNode]) -> None:
        now = self.clock()
        for node in nodes:
            self._observe_eviction(node, now)
        self._born.clear()
        self._released.clear()

    def _observe_eviction(self, node: ObservedNode, now: float) -> None:
        pages = self._pages(node)
        self.lifetime.observe(now - self._born[node.id], pages)
        self.idle_before_evict.observe(now - self.idle_since(node), pages)
        self.evicted_tokens += len(node.key)

    def _pages(self, node: ObservedNode) -> int:
        return len(node.key) // self.page_size
