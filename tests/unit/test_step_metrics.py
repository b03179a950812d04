"""The scheduler's fixed-bucket histograms, and how the frontend's collector turns their
snapshots (the block timings' among them: tests/unit/test_block_timings.py) into Prometheus
histograms."""

from __future__ import annotations

import math

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from radixrt.entrypoints.metrics import ServerMetrics, finished_reason
from radixrt.observability.histogram import FixedHistogram
from radixrt.scheduler.stats import SchedulerStats


def test_values_land_in_the_first_bucket_whose_bound_they_do_not_exceed() -> None:
    h = FixedHistogram((1, 10))
    for v in (0.5, 1, 1.5, 10, 11):
        h.observe(v)
    assert h.counts == [2, 2, 1]  # <=1, <=10, +Inf
    h.observe(3, count=4)
    assert h.counts == [2, 6, 1] and h.total == 9
    assert h.sum == 0.5 + 1 + 1.5 + 10 + 11 + 12


def test_a_snapshot_survives_the_scheduler_socket() -> None:
    m = SchedulerStats()
    m.iteration_tokens.observe(17)
    m.admitted(prompt_tokens=10, cached_tokens=4)
    snap = {"h": m.iteration_tokens.snapshot(), "q": m.prefix_cache_queries}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(snap)) == snap
    assert m.prefix_cache_hits == 4


def fake_stats(histograms: dict) -> dict:
    zero = FixedHistogram((1.0,)).snapshot()
    names = (
        "iteration_tokens_total",
        "kv_block_lifetime_seconds",
        "kv_block_idle_before_evict_seconds",
        "kv_block_reuse_gap_seconds",
        "grammar_compile_time_seconds",
        "spec_accept_length",
    )
    return {
        "running": 1,
        "queued": 2,
        "grammar_queue": 0,
        "pool_tokens": 100,
        "free_tokens": 50,
        "evictable_tokens": 20,
        "cache_hit_rate": 0.5,
        "num_preemptions": 3,
        "jump_forward_tokens": 0,
        "spec_draft_tokens": 9,
        "spec_accepted_tokens": 6,
        "beam_groups": 2,
        "beam_forks": 7,
        "beam_shared_tokens": 70,
        "beam_copied_tokens": 5,
        "prefix_cache_queries": 40,
        "prefix_cache_hits": 10,
        "evicted_tokens": 0,
        "histograms": {name: histograms.get(name, zero) for name in names},
    }


def test_the_collector_exports_cumulative_buckets_and_the_gauges() -> None:
    h = FixedHistogram((1, 8))
    for v in (1, 5, 5, 100):
        h.observe(v)
    stats = fake_stats({"iteration_tokens_total": h.snapshot()})
    text = ServerMetrics(lambda: stats, "m").render().decode()
    samples = {
        (s.name, s.labels.get("le")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    name = "radixrt:iteration_tokens_total"
    assert samples[(f"{name}_bucket", "1.0")] == 1
    assert samples[(f"{name}_bucket", "8.0")] == 3
    assert samples[(f"{name}_bucket", "+Inf")] == 4
    assert samples[(f"{name}_count", None)] == 4 and samples[(f"{name}_sum", None)] == 111
    assert samples[("radixrt:num_used_tokens", None)] == 30  # 100 - 50 free - 20 evictable
    assert samples[("radixrt:num_evictable_tokens", None)] == 20
    assert samples[("radixrt:prefix_cache_hits_total", None)] == 10
    assert math.isclose(samples[("radixrt:token_usage", None)], 0.3)
    assert samples[("radixrt:num_beam_groups", None)] == 2
    assert samples[("radixrt:beam_copied_tokens_total", None)] == 5


def test_finish_reasons_map_to_vllms_labels() -> None:
    assert finished_reason({"type": "stop", "matched": 2}) == "stop"
    assert finished_reason({"type": "length", "length": 5}) == "length"
    assert finished_reason({"type": "abort", "message": "aborted by the client"}) == "abort"
    assert finished_reason({"type": "abort", "message": "the request is invalid: x"}) == "error"
    assert finished_reason(None) == "error"
