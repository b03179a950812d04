"""The load endpoints a router polls: SGLang's `/v1/loads` (what SMG 1.13's load monitor reads
every --load-monitor-interval, for its load-aware and cache-aware policies and its overload
protection) and SGLang's older `/get_load` (one entry per data-parallel rank).

A radixrt server is one scheduler: one data-parallel rank, rank 0. `radixrt launch --dp-size N`
starts N such servers (entrypoints/dp_launch.py); the router sees N workers, each with one rank.
Values come from the scheduler's counters (one control round trip, on a worker thread).
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from radixrt.entrypoints.http_utils import exception_response, json_response
from radixrt.errors import APIError

# SGLang's /v1/loads sections. "core" is always answered; "disagg" adds SMG's flat
# disaggregation fields (disagg_load); radixrt has nothing to report for speculative decoding
# or LoRA, so those sections are accepted and left out (SMG reads a missing section as "not
# reported").
LOAD_SECTIONS = ("core", "memory", "spec", "lora", "disagg", "queues", "all")


class ThroughputMeter:
    """Generated tokens per second between two polls (SGLang's gen_throughput): the rate
    since the previous call, 0.0 on the first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[float, int] | None = None

    def rate(self, generated_tokens: int, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            last, self._last = self._last, (now, generated_tokens)
        if last is None or now <= last[0]:
            return 0.0
        return max(generated_tokens - last[1], 0) / (now - last[0])


def add_load_routes(app: FastAPI, state: Any) -> None:
    """Register /v1/loads and /get_load on `app`; `state` is the server's ServerState."""
    meter = ThroughputMeter()

    @app.get("/v1/loads")
    async def loads(request: Request) -> Response:
        try:
            sections = parse_sections(request.query_params.get("include", "core"))
            dp_rank = parse_dp_rank(request.query_params.get("dp_rank"))
            stats = await asyncio.to_thread(state.engine.get_stats)
        except Exception as exc:  # noqa: BLE001 - every error becomes an HTTP error
            return exception_response(exc)
        args = state.args
        snapshot = load_snapshot(
            stats, args.max_running_requests, meter, sections, args.disaggregation_mode
        )
        return json_response(loads_response([snapshot] if dp_rank in (None, 0) else []))

    @app.get("/get_load")
    async def get_load() -> Response:
        try:
            stats = await asyncio.to_thread(state.engine.get_stats)
        except Exception as exc:  # noqa: BLE001
            return exception_response(exc)
        return json_response([legacy_load(stats)])


def parse_sections(include: str) -> frozenset[str]:
    """The sections named by `include` (comma-separated); APIError naming an unknown one."""
    names = {name.strip() for name in include.split(",") if name.strip()} or {"core"}
    unknown = sorted(names - set(LOAD_SECTIONS))
    if unknown:
        raise APIError(
            f"include names unknown section(s) {unknown}; allowed: {', '.join(LOAD_SECTIONS)}",
            "include",
        )
    return frozenset(LOAD_SECTIONS) if "all" in names else frozenset(names)


def parse_dp_rank(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit():
        raise APIError(f"dp_rank must be a non-negative integer, got {value!r}", "dp_rank")
    return int(value)


def kv_tokens(stats: dict[str, Any]) -> tuple[int, int]:
    """(tokens held by running requests, pool size): the cache's evictable pages are free to
    take, so they do not count as used (as the radixrt:token_usage gauge)."""
    pool = stats["pool_tokens"]
    return pool - stats["free_tokens"] - stats["evictable_tokens"], pool


def load_snapshot(
    stats: dict[str, Any],
    max_running_requests: int,
    meter: ThroughputMeter,
    sections: frozenset[str] = frozenset({"core"}),
    disagg_mode: str = "null",
) -> dict[str, Any]:
    """One rank's entry of /v1/loads: SGLang's LoadSnapshot fields, as SMG reads them;
    `disagg_mode`: the server's --disaggregation-mode."""
    used, pool = kv_tokens(stats)
    waiting = stats["queued"] + stats["grammar_queue"]
    snapshot: dict[str, Any] = {
        "dp_rank": 0,
        "num_running_reqs": stats["running"],
        "num_waiting_reqs": waiting,
        "num_total_reqs": stats["running"] + waiting,
        "num_used_tokens": used,
        "max_total_num_tokens": pool,
        "token_usage": used / max(pool, 1),
        "gen_throughput": meter.rate(stats["generated_tokens"]),
        "cache_hit_rate": stats["cache_hit_rate"],
        "max_running_requests": max_running_requests,
    }
    if "memory" in sections:
        snapshot["num_free_tokens"] = stats["free_tokens"]
        snapshot["num_evictable_tokens"] = stats["evictable_tokens"]
    if "queues" in sections:
        snapshot["num_queue_reqs"] = stats["queued"]
        snapshot["num_grammar_queue_reqs"] = stats["grammar_queue"]
    if "disagg" in sections:
        snapshot.update(disagg_load(stats, disagg_mode))
    return snapshot


def disagg_load(stats: dict[str, Any], mode: str) -> dict[str, Any]:
    """The disaggregation fields of SMG's SchedulerLoadSnapshot, flat (SGLang nests them per
    queue stage; SMG reads these): the requests waiting for a transfer, on the side they wait
    on, and the mean transfer time and speed since start-up (0 before the first). Keys are
    read with .get: a server that is not disaggregated reports zeros."""
    queue = stats.get("disagg_queue", 0)
    transfers = stats.get("disagg_transfers", 0)
    seconds = stats.get("disagg_transfer_seconds", 0.0)
    return {
        "disagg_mode": mode,
        "prefill_queue_reqs": queue if mode == "prefill" else 0,
        "decode_queue_reqs": queue if mode == "decode" else 0,
        "kv_transfer_latency_ms": seconds / transfers * 1000 if transfers else 0.0,
        "kv_transfer_speed_gb_s": (
            stats.get("disagg_transfer_bytes", 0) / seconds / 1e9 if seconds > 0 else 0.0
        ),
    }


def loads_response(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """The /v1/loads body: a timestamp, the rank count and one snapshot per rank asked for."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"timestamp": now.isoformat(), "dp_rank_count": 1, "loads": snapshots}


def legacy_load(stats: dict[str, Any]) -> dict[str, Any]:
    """One entry of SGLang's /get_load (GetLoadReqOutput): requests, waiting requests and
    the KV tokens in use."""
    waiting = stats["queued"] + stats["grammar_queue"]
    return {
        "dp_rank": 0,
        "num_reqs": stats["running"] + waiting,
        "num_waiting_reqs": waiting,
        "num_tokens": kv_tokens(stats)[0],
    }
