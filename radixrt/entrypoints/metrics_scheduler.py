"""The metrics only the scheduler knows, fetched over one control round trip when Prometheus
scrapes: gauges of the batch and the KV pool, its counters, and its histograms (bucket counts
kept in the scheduler process in radixrt/observability/histogram.py buckets)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

# get_stats() key -> (metric name without the prefix, help); counters get `_total` appended.
_COUNTERS = {
    "num_preemptions": ("num_preemptions", "Requests retracted to free KV"),
    "jump_forward_tokens": ("jump_forward_tokens", "Jump-forward tokens the model confirmed"),
    "spec_draft_tokens": (
        "spec_decode_num_draft_tokens",
        "Speculative draft tokens the model verified",
    ),
    "spec_accepted_tokens": (
        "spec_decode_num_accepted_tokens",
        "Speculative draft tokens the model accepted",
    ),
    "beam_forks": ("beam_forks", "Beams forked by beam search"),
    "beam_shared_tokens": (
        "beam_shared_tokens",
        "KV positions a forked beam shares with its parent through the prefix cache",
    ),
    "beam_copied_tokens": (
        "beam_copied_tokens",
        "KV positions copied for forked beams (their parent's partial last page)",
    ),
    "prefix_cache_queries": (
        "prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache (at each request's admission)",
    ),
    "prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens the prefix cache served"),
    "evicted_tokens": ("evicted_tokens", "Tokens evicted from the prefix cache (flush included)"),
}
# Prefill/decode disaggregation (docs/disaggregation.md), read with .get: 0 on a server that
# is not disaggregated. Seconds and bytes are sums over completed transfers, so
# rate(bytes) / rate(seconds) is the transfer speed and rate(seconds) / rate(transfers) the
# mean transfer time.
_DISAGG_COUNTERS = {
    "disagg_transfers": (
        "disagg_transfers",
        "KV transfers completed (prefill: rooms sent; decode: rooms received)",
    ),
    "disagg_transfer_failures": (
        "disagg_transfer_failures",
        "KV transfers that failed or timed out",
    ),
    "disagg_transfer_bytes": ("disagg_transfer_bytes", "Bytes of KV pages transferred"),
    "disagg_transfer_seconds": (
        "disagg_transfer_seconds",
        "Seconds spent in KV transfers (sum over completed transfers)",
    ),
    "disagg_transfer_tokens": (
        "disagg_transfer_tokens",
        "KV positions transferred (sent or received)",
    ),
    "disagg_reused_tokens": (
        "disagg_reused_tokens",
        "Prompt tokens a decode server already held in its prefix cache and did not ask for",
    ),
}
_HISTOGRAMS = {
    "iteration_tokens_total": "Tokens computed per scheduler step (prefill and decode)",
    "kv_block_lifetime_seconds": "KV page lifetime, from insertion in the cache to eviction",
    "kv_block_idle_before_evict_seconds": "KV page idle time (unused) before its eviction",
    "kv_block_reuse_gap_seconds": "Time from a request releasing a KV page to the next reuse",
    "grammar_compile_time_seconds": "Time a constrained request waited for its grammar",
    "spec_accept_length": "Tokens per speculative verification (kept drafts and the next one)",
}


class SchedulerCollector:
    """A prometheus_client custom collector over `get_stats` (Scheduler.get_stats)."""

    def __init__(self, get_stats: Callable[[], dict[str, Any]], model_name: str) -> None:
        self.get_stats = get_stats
        self.model_name = model_name

    def describe(self) -> list[Metric]:  # none up front: collect() must not run at registration
        return []

    def collect(self) -> Iterator[Metric]:
        stats = self.get_stats()
        yield from self._gauges(stats)
        for key, (name, doc) in _COUNTERS.items():
            yield self._counter(name, doc, stats[key])
        for key, (name, doc) in _DISAGG_COUNTERS.items():
            yield self._counter(name, doc, stats.get(key, 0))
        for name, doc in _HISTOGRAMS.items():
            yield self._histogram(name, doc, stats["histograms"][name])

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        c = CounterMetricFamily(f"radixrt:{name}", doc, labels=["model_name"])
        c.add_metric([self.model_name], value)
        return c

    def _gauges(self, stats: dict[str, Any]) -> Iterator[Metric]:
        pool = max(stats["pool_tokens"], 1)
        used = stats["pool_tokens"] - stats["free_tokens"] - stats["evictable_tokens"]
        gauges = {
            "num_running_reqs": ("Requests running in the batch", stats["running"]),
            "num_queue_reqs": ("Requests waiting for admission", stats["queued"]),
            "num_grammar_queue_reqs": (
                "Constrained requests waiting for their grammar to compile",
                stats["grammar_queue"],
            ),
            "num_beam_groups": ("Beam-search groups running", stats["beam_groups"]),
            "token_usage": ("Fraction of the KV pool held by running requests", used / pool),
            "num_used_tokens": ("KV pool tokens held by running requests", used),
            "num_evictable_tokens": (
                "KV pool tokens the prefix cache holds that no request uses (evictable)",
                stats["evictable_tokens"],
            ),
            "cache_hit_rate": (
                "Prompt tokens served from the cache / prompt tokens, since start-up",
                stats["cache_hit_rate"],
            ),
            "max_total_num_tokens": ("KV pool size in tokens", stats["pool_tokens"]),
            "disagg_queue_reqs": (
                "Requests waiting for a KV transfer (prefill: finished prompts held for their "
                "decode server; decode: requests waiting for their pages)",
                stats.get("disagg_queue", 0),
            ),
        }
        for name, (doc, value) in gauges.items():
            g = GaugeMetricFamily(f"radixrt:{name}", doc, labels=["model_name"])
            g.add_metric([self.model_name], value)
            yield g

    def _histogram(self, name: str, doc: str, snap: dict[str, Any]) -> Metric:
        """A HistogramMetricFamily from a FixedHistogram snapshot (counts per bucket)."""
        h = HistogramMetricFamily(f"radixrt:{name}", doc, labels=["model_name"])
        bounds = [*snap["bounds"], math.inf]
        cumulative, buckets = 0, []
        for bound, count in zip(bounds, snap["counts"], strict=True):
            cumulative += count
            buckets.append((_le(bound), cumulative))
        h.add_metric([self.model_name], buckets, snap["sum"])
        return h


def _le(bound: float) -> str:
    """A bucket's `le` label as prometheus_client writes it ("1.0", "0.5", "+Inf")."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))
