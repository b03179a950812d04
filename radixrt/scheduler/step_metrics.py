"""Histograms and counters the scheduler process keeps for /metrics.

The scheduler cannot reach prometheus_client's registry (it lives in the frontend process), so
it counts into fixed buckets here and ships plain snapshots inside get_stats()'s dict (lists
of ints and floats: msgspec encodes them); the frontend's collector turns them into Prometheus
histograms at scrape time. An observation is one bisect and two additions: cheap enough for
every step and every cache node touched.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import Any

# vLLM's iteration_tokens_total buckets (powers of two up to a large prefill step).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# KV block times: from a fraction of a second (a page reused by the next request) to an hour.
BLOCK_SECONDS_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Grammar compile: a cache hit is instant, a large JSON schema takes seconds.
COMPILE_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class FixedHistogram:
    """Counts per bucket (upper bounds `bounds`, then +Inf) and the sum of the values."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        assert list(bounds) == sorted(set(bounds)), f"bucket bounds must increase: {bounds}"
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value` (a node of several pages counts once per page)."""
        # bisect_left: a value equal to a bound belongs to that bucket (Prometheus' `le`).
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count

    @property
    def total(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> dict[str, Any]:
        """{"bounds", "counts" (per bucket, not cumulative; the last is +Inf), "sum"}."""
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum}


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


class StepMetrics:
    """What the scheduler loop counts per step: tokens per step, and prefix-cache lookups in
    tokens (queried: the prompt; hit: what the cache served) at each request's admission."""

    def __init__(self) -> None:
        self.iteration_tokens = FixedHistogram(ITERATION_TOKEN_BUCKETS)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prefix_cache_queries += prompt_tokens
        self.prefix_cache_hits += cached_tokens
