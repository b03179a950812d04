"""vLLM's kv_block_* histograms, kept by the radix cache (radix_cache.py says how)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from radixrt.observability.histogram import FixedHistogram

# KV block times: from a fraction of a second (a page reused by the next request) to an hour.
BLOCK_SECONDS_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class KVBlockTimings:
    """vLLM's kv_block_* histograms, counted per page (vLLM's block) of the radix cache.

    - lifetime: from the page's insertion into the cache to its eviction;
    - idle before evict: from the last time a request let go of it (or its insertion, if none
      held it since) to its eviction;
    - reuse gap: from a request letting go of it to the next request taking it again.
    Eviction includes a cache flush. `clock` is monotonic seconds (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lifetime = FixedHistogram(BLOCK_SECONDS_BUCKETS)
        self.idle_before_evict = FixedHistogram(BLOCK_SECONDS_BUCKETS)
        self.reuse_gap = FixedHistogram(BLOCK_SECONDS_BUCKETS)
        self.evicted_tokens = 0

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {
            "kv_block_lifetime_seconds": self.lifetime.snapshot(),
            "kv_block_idle_before_evict_seconds": self.idle_before_evict.snapshot(),
            "kv_block_reuse_gap_seconds": self.reuse_gap.snapshot(),
        }
