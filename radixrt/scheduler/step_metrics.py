"""Histograms and counters the scheduler loop keeps for /metrics (shipped in get_stats(); see
radixrt/observability/histogram.py)."""

from __future__ import annotations

from radixrt.observability.histogram import FixedHistogram

# vLLM's iteration_tokens_total buckets (powers of two up to a large prefill step).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Grammar compile: a cache hit is instant, a large JSON schema takes seconds.
COMPILE_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


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
