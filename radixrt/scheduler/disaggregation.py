"""Prefill/decode disaggregation in the scheduler: the part each role adds to the loop.

A prefill server's side (disagg_prefill.py) holds each finished prompt's K/V until the decode
server that has the same room asks for it, sends it, then releases the request. A decode
server's side (disagg_decode.py) admits each request by matching its prompt in its own radix
cache, asks the prefill server for the rest, writes what comes into its pool and lets the
request decode from there. Both run between steps, and only poll: the loop never blocks on
a peer. docs/disaggregation.md has the protocol, the timeouts and the faults.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from radixrt.cache.kv_pool import KVPool
from radixrt.protocol.messages import Bootstrap, ReqOutput
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.output import OutputProcessor
from radixrt.scheduler.req import Req
from radixrt.scheduler.stats import SchedulerStats
from radixrt.server_args import ServerArgs


@dataclass
class DisaggParts:
    """What either side works with: the scheduler's KV manager, pool, output processor and
    stats, the KV a new decode must leave for the running ones, and how long a room may wait
    for its peer (--disaggregation-transfer-timeout)."""

    kv: KVManager
    pool: KVPool
    outputs: OutputProcessor
    stats: SchedulerStats
    reserved_tokens: Callable[[list[Req]], int]
    timeout: float


class DisaggSide:
    """The interface the scheduler calls; each role overrides what it does."""

    mode = "null"

    def __init__(self, parts: DisaggParts) -> None:
        self.parts = parts
        self.kv = parts.kv
        self.stats = parts.stats
        self.timeout = parts.timeout

    def adopt(self, req: Req, bootstrap: Bootstrap) -> bool:
        """Take a request that carries a room. True: this side queues it (the scheduler
        must not); False: it goes on as usual. ValueError for a room already in use."""
        raise NotImplementedError

    def ready(self, req: Req) -> bool:
        """A request whose grammar compiled: True if this side queues it."""
        return False

    def hold(self, req: Req) -> bool:
        """A request that just finished: True if this side keeps it (and its K/V) for now."""
        return False

    def poll(self, running: list[Req], waiting: list[Req]) -> list[ReqOutput]:
        """Between steps: what the peers sent, what timed out; the outputs to emit."""
        raise NotImplementedError

    def abort(self, rid: str) -> list[ReqOutput]:
        """The client gave `rid` up: end what this side holds of it (outputs to emit)."""
        raise NotImplementedError

    def holding(self) -> list[Req]:
        """Requests outside running that hold K/V here (the KV check counts their pages)."""
        raise NotImplementedError

    @property
    def queued(self) -> int:
        """Requests waiting on a transfer (SMG's prefill_queue_reqs / decode_queue_reqs)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def count_transfer(self, tokens: int, nbytes: int, started: float) -> None:
        self.stats.disagg_transfers += 1
        self.stats.disagg_transfer_tokens += tokens
        self.stats.disagg_transfer_bytes += nbytes
        self.stats.disagg_transfer_seconds += time.perf_counter() - started


def create_disagg_side(args: ServerArgs, parts: DisaggParts) -> DisaggSide | None:
    """The side for --disaggregation-mode (None: not disaggregated), with its endpoint. The
    decode side's allowed peers are resolved here, once, not in the loop."""
    key = (args.bootstrap_key or "").encode()
    if args.disaggregation_mode == "prefill":
        from radixrt.disaggregation.endpoints import PrefillEndpoint
        from radixrt.scheduler.disagg_prefill import PrefillSide

        port = args.disaggregation_bootstrap_port
        return PrefillSide(parts, PrefillEndpoint(args.host, port, key))
    if args.disaggregation_mode == "decode":
        from radixrt.disaggregation.endpoints import DecodeEndpoint
        from radixrt.disaggregation.pages import max_frame_bytes
        from radixrt.disaggregation.peers import BootstrapPeers
        from radixrt.scheduler.disagg_decode import DecodeSide

        peers = BootstrapPeers(args.disaggregation_bootstrap_peers)
        endpoint = DecodeEndpoint(peers, key, max_frame_bytes(parts.pool), parts.timeout)
        recompute = args.disaggregation_failure_policy == "recompute"
        return DecodeSide(parts, endpoint, recompute, args.max_running_requests)
    return None
