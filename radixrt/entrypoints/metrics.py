"""Prometheus metrics, named in SGLang's and vLLM's manner with a `radixrt:` prefix.

Request-level counters and histograms are observed in the frontend as outputs arrive (the
engine's observer hook, on its dispatcher thread); scheduler-level values (running and queued
requests, KV usage, prefix-cache lookups, per-step and per-page histograms) are read from the
scheduler at scrape time (metrics_scheduler.py). Every series exists from start-up at 0, so a
`rate()` panel never says "no data". docs/metrics.md lists them all.
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

from radixrt.entrypoints.metrics_scheduler import SchedulerCollector
from radixrt.frontend.request_state import ReqState
from radixrt.protocol.messages import CLIENT_ABORT_MESSAGE, ReqOutput

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
# vLLM's request_success_total{finished_reason}: "error" is a request that failed (refused by
# the scheduler, a grammar that did not compile, an internal error), "abort" one the client
# (or /abort_request) ended.
FINISHED_REASONS = ("stop", "length", "abort", "error")


def finished_reason(reason: dict[str, Any] | None) -> str:
    """The `finished_reason` label of a finish reason dict (ReqOutput.finish_reason)."""
    kind = (reason or {}).get("type")
    if kind in ("stop", "length"):
        return kind
    if kind == "abort" and (reason or {}).get("message") == CLIENT_ABORT_MESSAGE:
        return "abort"
    return "error"


class ServerMetrics:
    def __init__(self, get_stats: Callable[[], dict[str, Any]], model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name}
        self._make_request_metrics()
        by_reason = Counter(
            "radixrt:request_success",
            "Requests finished, by finish reason (vLLM's request_success_total)",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.requests_by_reason = {r: by_reason.labels(model_name, r) for r in FINISHED_REASONS}
        # Filled by the HTTP middleware (http_metrics.py), which also creates its series.
        self.http_requests = Counter(
            "radixrt:http_requests",
            "HTTP requests by route template and status class",
            ["model_name", "route", "status"],
            registry=self.registry,
        )
        self.registry.register(SchedulerCollector(get_stats, model_name))

    def _make_request_metrics(self) -> None:
        def counter(name: str, doc: str) -> Counter:
            c = Counter(f"radixrt:{name}", doc, ["model_name"], registry=self.registry)
            return c.labels(**self.labels)

        def histogram(name: str, doc: str) -> Histogram:
            h = Histogram(
                f"radixrt:{name}",
                doc,
                ["model_name"],
                registry=self.registry,
                buckets=_LATENCY_BUCKETS,
            )
            return h.labels(**self.labels)

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
        self.prefill_time = histogram(
            "request_prefill_time_seconds", "Admission to first token (prefill)"
        )
        self.decode_time = histogram(
            "request_decode_time_seconds", "First token to the last output (decode)"
        )

    def observe(self, state: ReqState, out: ReqOutput) -> None:
        """Called with every output of every request, before the request absorbs it."""
        now = time.time()
        new = len(out.new_output_ids)
        if new and state.last_output_wall is not None and state.output_ids:
            self.itl.observe((now - state.last_output_wall) / new)
        if new:
            state.last_output_wall = now
        if out.finished:
            self._observe_finished(state, out, now)

    def _observe_finished(self, state: ReqState, out: ReqOutput, now: float) -> None:
        self.requests.inc()
        self.requests_by_reason[finished_reason(out.finish_reason)].inc()
        self.prompt_tokens.inc(out.prompt_tokens)
        self.generation_tokens.inc(out.completion_tokens)
        self.cached_tokens.inc(out.cached_tokens)
        if (out.finish_reason or {}).get("type") == "abort":
            self.aborted.inc()
        e2e = now - state.created_wall
        self.e2e.observe(e2e)
        if out.admitted_at is not None:
            self.queue_time.observe(max(out.admitted_at - state.created_wall, 0))
        if out.first_token_at is None:
            return
        if out.admitted_at is not None:
            self.prefill_time.observe(max(out.first_token_at - out.admitted_at, 0))
        self.decode_time.observe(max(now - out.first_token_at, 0))
        ttft = max(out.first_token_at - state.created_wall, 0)
        self.ttft.observe(ttft)
        if out.completion_tokens > 1:
            self.tpot.observe((e2e - ttft) / (out.completion_tokens - 1))

    def render(self) -> bytes:
        """The Prometheus text exposition (blocks on one scheduler round trip)."""
        return generate_latest(self.registry)
