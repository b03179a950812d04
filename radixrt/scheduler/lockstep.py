"""Tensor parallelism's lockstep: every rank's scheduler takes the same decisions.

Rank 0 alone talks to the frontend, compiles grammars and samples; each iteration it relays
to the other ranks what it received (`Relay`: the raw messages, the constrained requests whose
grammar it has taken, whether to stop), and after each forward what sampling decided for each
request of the batch (`Outcome`: tokens kept and added, finish reason, a rejected proposal's
K/V). The other ranks run the same planner over the same state, so they build the same batches
and call the model's collectives in the same order; they send nothing. With KV checks on,
a digest of every rank's requests, radix tree and page tables is all-gathered after each step,
and a rank that differs from rank 0 stops the server naming it (`LockstepError`).
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

import msgspec
import torch
import torch.distributed as dist

from radixrt.distributed import TPGroup, init_tp_group
from radixrt.errors import LockstepError
from radixrt.grammar.constraint import constraint_of
from radixrt.scheduler.components import resolve_device
from radixrt.scheduler.req import GrammarState, Req
from radixrt.server_args import ServerArgs

if TYPE_CHECKING:
    from radixrt.scheduler.kv_manager import KVManager
    from radixrt.scheduler.schedule_batch import ScheduleBatch
    from radixrt.scheduler.scheduler import Scheduler


class Relay(msgspec.Struct, array_like=True):
    """What rank 0 received this iteration, for the other ranks to handle in the same order."""

    messages: list[bytes]
    compiled: list[int]  # arrival orders of constrained requests ready to schedule
    refused: list[int]  # ... and of those whose grammar cannot run (rank 0 told the client)
    stop: bool = False


class Outcome(msgspec.Struct, array_like=True):
    """One request's state after sampling, as rank 0 decided it."""

    keep: int  # output ids kept (a rejected or failed proposal drops some)
    added: list[int]
    finish_reason: dict[str, Any] | None
    failed: bool
    num_slots: int  # less than before when a rejected proposal's K/V was dropped
    unverified: int  # the jump-forward proposal now at the end of output_ids


class NullTransport:
    """A rank > 0's transport: it hears from rank 0 only, and what it would send is dropped."""

    def recv(self, timeout: float | None) -> list[bytes]:
        return []

    def send(self, data: bytes, block: bool = True, timeout: float | None = None) -> bool:
        return True


class ReplicaMatcher:
    """A rank > 0's stand-in for a request's grammar matcher: rank 0 masks and accepts, so
    this one only tracks the proposal's length (which the planner and batches read)."""

    def rollback(self, n: int) -> None:
        pass


class Lockstep:
    """The relay, outcome and digest steps of one rank's scheduler."""

    def __init__(self, group: TPGroup, check: bool, local_ranks: range) -> None:
        """`local_ranks`: the ranks on this node (whose pids this one can look up)."""
        self.group = group
        self.check = check
        self.local_ranks = local_ranks
        self.pids: list[int] = []  # every rank's, once `join` has run
        self._held: dict[int, Req] = {}  # rank > 0: constrained requests until rank 0 takes them
        self._codec_relay = (msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(Relay))
        self._outcomes = msgspec.msgpack.Decoder(list[Outcome])

    @property
    def is_leader(self) -> bool:
        return self.group.rank == 0

    @property
    def idle_wait_s(self) -> float:
        """Rank 0 relays at least this often while idle, so the others' wait never times out."""
        return min(1.0, self.group.timeout_s / 4)

    def join(self) -> None:
        """Once every rank has built its model: learn each rank's pid (to name a dead one)."""
        pid = torch.tensor([os.getpid()], dtype=torch.int64, device=self.group.device)
        self.pids = self.group.all_gather(pid, dim=0).cpu().tolist()

    def close(self) -> None:
        """Leave the group (its threads must not outlive the interpreter's exit)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def dead_ranks(self) -> str:
        """Which ranks of this node have ended (a pid gone or a zombie), for an error."""
        dead = [
            f"rank {r} (pid {pid})"
            for r, pid in enumerate(self.pids)
            if r in self.local_ranks and not _running(pid)
        ]
        if not dead:
            return "every rank of this node still runs: one is stuck, or another node's is gone"
        return ", ".join(dead) + " ended"

    # -- relay ------------------------------------------------------------------------------
    def relay(self, relay: Relay | None) -> Relay:
        """Rank 0 passes what it received; every rank gets it back."""
        enc, dec = self._codec_relay
        data = self.group.broadcast_bytes(enc.encode(relay) if relay is not None else None, 0)
        return relay if relay is not None else dec.decode(data)

    def hold(self, req: Req) -> bool:
        """Rank > 0: keep a constrained request until rank 0 says its grammar compiled; False
        (nothing done) if it has no constraint."""
        if constraint_of(req.sampling_params) is None:
            return False
        self._held[req.arrival_order] = req
        return True

    def release_held(self, relay: Relay) -> list[Req]:
        """Rank > 0: the held requests rank 0 took, in its order, with a stand-in matcher;
        those it refused are forgotten (it has told the client)."""
        for order in relay.refused:
            self._held.pop(order, None)
        ready = []
        for order in relay.compiled:
            req = self._held.pop(order, None)
            if req is None:
                raise LockstepError(
                    f"rank 0 scheduled constrained request #{order}, which rank "
                    f"{self.group.rank} does not hold (it refused it, or never received it)"
                )
            found = constraint_of(req.sampling_params)
            assert found is not None
            req.grammar = GrammarState(found[0], ReplicaMatcher())
            ready.append(req)
        return ready

    def cancel_held(self, rid: str) -> None:
        for order in [o for o, r in self._held.items() if r.rid == rid]:
            del self._held[order]

    # -- outcome ----------------------------------------------------------------------------
    def before_sampling(self, batch: ScheduleBatch) -> list[int]:
        return [len(r.output_ids) for r in batch.reqs]

    def share_outcome(self, batch: ScheduleBatch, lengths: list[int]) -> None:
        """Rank 0, after sampling: tell the others what each request of the batch became."""
        outcomes = [_outcome_of(req, n) for req, n in zip(batch.reqs, lengths, strict=True)]
        self.group.broadcast_bytes(msgspec.msgpack.encode(outcomes), 0)

    def apply_outcome(self, batch: ScheduleBatch, kv: KVManager) -> None:
        """Rank > 0, instead of sampling: take rank 0's outcome of every request."""
        outcomes = self._outcomes.decode(self.group.broadcast_bytes(None, 0))
        if len(outcomes) != len(batch.reqs):
            raise LockstepError(
                f"rank {self.group.rank} scheduled {len(batch.reqs)} requests where rank 0 "
                f"scheduled {len(outcomes)}"
            )
        for req, out in zip(batch.reqs, outcomes, strict=True):
            del req.output_ids[out.keep :]
            req.output_ids.extend(out.added)
            req.finish_reason = out.finish_reason
            req.failed = out.failed
            if req.num_slots > out.num_slots:
                kv.truncate(req, out.num_slots)
            if req.grammar is not None:
                req.grammar.unverified = out.unverified

    # -- digest -----------------------------------------------------------------------------
    def check_agreement(self, scheduler: Scheduler) -> None:
        """All-gather every rank's state digest; LockstepError naming the ranks that differ."""
        digest = torch.tensor([state_digest(scheduler)], dtype=torch.int64)
        every = self.group.all_gather(digest.to(self.group.device), dim=0).cpu().tolist()
        diverged = [rank for rank, d in enumerate(every) if d != every[0]]
        if diverged:
            ranks = ", ".join(str(r) for r in diverged)
            raise LockstepError(
                f"tensor-parallel rank(s) {ranks} diverged from rank 0 after step "
                f"{scheduler.stats['steps']}: their running requests, radix tree or page "
                "tables differ"
            )


def _outcome_of(req: Req, length_before: int) -> Outcome:
    # Sampling only drops ids from the end (a rejected or failed proposal) and appends.
    keep = min(length_before, len(req.output_ids))
    return Outcome(
        keep,
        req.output_ids[keep:],
        req.finish_reason,
        req.failed,
        req.num_slots,
        req.num_unverified,
    )


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def state_digest(scheduler: Scheduler) -> int:
    """A 63-bit hash of what every rank must agree on: each running and waiting request's
    tokens, lengths and table row, the radix tree's slots and counters, the free pages."""
    h = hashlib.blake2b(digest_size=8)
    parts = scheduler.parts
    for req in scheduler.running:
        h.update(repr((req.rid, req.output_ids, req.kv_len, req.num_slots, req.tree_len)).encode())
        h.update(parts.table.read(req.table_row, 0, req.num_slots).cpu().numpy().tobytes())
    h.update(repr([(r.rid, r.output_ids) for r in scheduler.waiting]).encode())
    cache = parts.cache
    h.update(cache.cached_slots().sort().values.cpu().numpy().tobytes())
    counters = (cache.evictable_size(), cache.protected_size(), parts.allocator.available_tokens)
    h.update(repr(counters).encode())
    return int.from_bytes(h.digest(), "little") >> 1


def join_group(
    args: ServerArgs, rank: int, init_method: str | None
) -> tuple[TPGroup | None, Lockstep | None]:
    """This rank's group and lockstep (both None at tp_size 1: no collectives). On CUDA rank
    r of a node takes its device r; gloo runs on the CPU."""
    if args.tp_size == 1:
        return None, None
    assert init_method is not None, "processes.py gives every rank the rendezvous address"
    per_node = args.tp_size // args.nnodes
    device = resolve_device(args.device)
    if device.startswith("cuda"):
        device = f"cuda:{rank % per_node}"
        torch.cuda.set_device(device)
    group = init_tp_group(rank, args.tp_size, init_method, device, args.dist_timeout)
    node = rank // per_node
    local = range(node * per_node, (node + 1) * per_node)
    return group, Lockstep(group, args.enable_kv_checks, local)
