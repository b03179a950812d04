"""The scheduler's answers to control messages (stats, the cache tree, flushing the cache),
made between two steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixrt.protocol.messages import ControlReply, GetCacheTreeReq
from radixrt.scheduler.cache_snapshot import cache_snapshot

if TYPE_CHECKING:
    from radixrt.scheduler.scheduler import Scheduler


def stats_reply(scheduler: Scheduler, check_kv: bool) -> ControlReply:
    """get_stats(); with check_kv, the KV accounting check first (its failure is the
    reply's message)."""
    message = ""
    if check_kv:
        try:
            scheduler.check_kv()
        except AssertionError as e:
            message = f"KV accounting check failed: {e}"
    return ControlReply("get_stats", not message, message, scheduler.get_stats())


def cache_tree_reply(scheduler: Scheduler, msg: GetCacheTreeReq) -> ControlReply:
    """A bounded snapshot (cache_snapshot.py), taken here, between two steps."""
    snapshot = cache_snapshot(
        scheduler.parts.cache,
        scheduler.running,
        scheduler.waiting,
        scheduler.get_stats(),
        depth=msg.depth,
        max_nodes=msg.max_nodes,
    )
    return ControlReply("get_cache_tree", True, cache_tree=snapshot)


def flush_cache(scheduler: Scheduler) -> ControlReply:
    """Empty the prefix cache, unless a request runs, waits or holds a transfer's pages."""
    busy = len(scheduler.running) + len(scheduler.waiting)
    busy += scheduler.disagg.queued if scheduler.disagg else 0
    if busy:
        return ControlReply(
            "flush_cache", False, f"cannot flush the cache while {busy} requests run"
        )
    scheduler.kv.flush_cache()
    return ControlReply("flush_cache", True)
