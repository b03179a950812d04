"""Prometheus metrics, named in SGLang's manner with a `radixrt:` prefix.

Request-level counters and histograms are observed in the frontend as outputs arrive (the
engine's observer hook, on its dispatcher thread); scheduler-level values (running and queued
requests, KV usage, cache hit rate, preemptions) are read from the scheduler at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from radixrt.messages import ReqOutput
from radixrt.request_state import ReqState

disable_created_metrics()  # no *_created series: SGLang's and vLLM's dashboards ignore them

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)


class ServerMetrics:
    def __init__(self, get_stats: Callable[[], dict[str, Any]], model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.labels = {"model_name": model_name}

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"radixrt:{name}", doc, labels, registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(
                f"radixrt:{name}", doc, labels, registry=self.registry, buckets=_LATENCY_BUCKETS
            )

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed")
        self.generation_tokens = counter("generation_tokens", "Tokens generated")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the cache")
        self.requests = counter("num_requests", "Requests finished (any reason)")
        self.aborted = counter("num_aborted_requests", "Requests aborted or refused")
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token")
        self.itl = histogram("inter_token_latency_seconds", "Time between streamed tokens")
        self.tpot = histogram("time_per_output_token_seconds", "Decode time per output token")
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency")
        self.queue_time = histogram("queue_time_seconds", "Time waiting before admission")
        self.registry.register(_SchedulerCollector(get_stats, model_name))

    def observe(self, state: ReqState, out: ReqOutput) -> None:
        """Called with every output of every request, before the request absorbs it."""
        now = time.time()
        lab = self.labels
        new = len(out.new_output_ids)
        if new and state.last_output_wall is not None and state.output_ids:
            self.itl.labels(**lab).observe((now - state.last_output_wall) / new)
        if new:
            state.last_output_wall = now
        if not out.finished:
            return
        self.requests.labels(**lab).inc()
        self.prompt_tokens.labels(**lab).inc(out.prompt_tokens)
        self.generation_tokens.labels(**lab).inc(out.completion_tokens)
        self.cached_tokens.labels(**lab).inc(out.cached_tokens)
        if (out.finish_reason or {}).get("type") == "abort":
            self.aborted.labels(**lab).inc()
        e2e = now - state.created_wall
        self.e2e.labels(**lab).observe(e2e)
        if out.admitted_at is not None:
            self.queue_time.labels(**lab).observe(max(out.admitted_at - state.created_wall, 0))
        if out.first_token_at is not None:
            ttft = max(out.first_token_at - state.created_wall, 0)
            self.ttft.labels(**lab).observe(ttft)
            if out.completion_tokens > 1:
                self.tpot.labels(**lab).observe((e2e - ttft) / (out.completion_tokens - 1))

    def render(self) -> bytes:
        """The Prometheus text exposition (blocks on one scheduler round trip)."""
        return generate_latest(self.registry)


class _SchedulerCollector:
    """Values only the scheduler knows, fetched when Prometheus scrapes."""

    def __init__(self, get_stats: Callable[[], dict[str, Any]], model_name: str) -> None:
        self.get_stats = get_stats
        self.model_name = model_name

    def describe(self):  # no up-front description: collect() must not run at registration
        return []

    def collect(self):
        stats = self.get_stats()
        pool = max(stats["pool_tokens"], 1)
        used = pool - stats["free_tokens"] - stats["evictable_tokens"]
        gauges = {
            "num_running_reqs": ("Requests running in the batch", stats["running"]),
            "num_queue_reqs": ("Requests waiting for admission", stats["queued"]),
            "token_usage": ("Fraction of the KV pool held by running requests", used / pool),
            "cache_hit_rate": (
                "Prompt tokens served from the cache / prompt tokens",
                stats["cache_hit_rate"],
            ),
            "max_total_num_tokens": ("KV pool size in tokens", stats["pool_tokens"]),
        }
        for name, (doc, value) in gauges.items():
            g = GaugeMetricFamily(f"radixrt:{name}", doc, labels=["model_name"])
            g.add_metric([self.model_name], value)
            yield g
        c = CounterMetricFamily(
            "radixrt:num_preemptions", "Requests retracted to free KV", labels=["model_name"]
        )
        c.add_metric([self.model_name], stats["num_preemptions"])
        yield c
