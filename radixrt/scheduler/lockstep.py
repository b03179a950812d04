"""Tensor parallelism's lockstep: every rank's scheduler takes the same decisions.

The scheduler is given one `Lockstep` (lockstep_base.py) when it is built: `SingleRank` without
tensor parallelism, `Leader` on rank 0, `Follower` on the others.

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
from radixrt.scheduler.lockstep_base import Lockstep, SingleRank, Turn
from radixrt.scheduler.req import GrammarState, Req
from radixrt.scheduler.structured import Compiled
from radixrt.server_args import ServerArgs

if TYPE_CHECKING:
    from radixrt.ipc.transport import Transport
    from radixrt.scheduler.kv_manager import KVManager
    from radixrt.scheduler.output import OutputProcessor
    from radixrt.scheduler.schedule_batch import ScheduleBatch
    from radixrt.scheduler.scheduler import Scheduler
    from radixrt.scheduler.structured import StructuredGeneration


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
    unverified: int  # the drafts now at the end of output_ids
    draft_kind: str


class NullTransport:
    """A rank > 0's transport: it hears from rank 0 only, and what it would send is dropped."""

    def recv(self, timeout: float | None) -> list[bytes]:
        return []

    def send(self, data: bytes, block: bool = True, timeout: float | None = None) -> bool:
        return True


class ReplicaMatcher:
    """A rank > 0's stand-in for a request's grammar matcher: rank 0 masks and accepts, so
    this one does nothing (the drafts' count, which the planner reads, is on the request)."""

    def rollback(self, n: int) -> None:
        pass


class TensorParallel(SingleRank):
    """What rank 0 and the others share: the group, the relay and the digest check; what
    they do as a single rank would (submit, cancel in rank 0) comes from SingleRank."""

    def __init__(self, group: TPGroup, check: bool, local_ranks: range) -> None:
        """`local_ranks`: the ranks on this node (whose pids this one can look up)."""
        self.group = group
        self.check = check
        self.local_ranks = local_ranks
        self.pids: list[int] = []  # every rank's, once `join` has run
        self._codec_relay = (msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(Relay))

    @property
    def idle_wait_s(self) -> float:
        """Rank 0 relays at least this often while idle, so the others' wait never times out."""
        return min(1.0, self.group.timeout_s / 4)

    def join(self) -> None:
        """Learn each rank's pid (to name a dead one)."""
        pid = torch.tensor([os.getpid()], dtype=torch.int64, device=self.group.device)
        self.pids = self.group.all_gather(pid, dim=0).cpu().tolist()

    def close(self) -> None:
        """Leave the group (its threads must not outlive the interpreter's exit)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def failure_message(self, error: BaseException) -> str:
        if type(error).__name__ == "RankDied":
            return f"{error} [{self.dead_ranks()}]"
        return str(error)

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

    def relay(self, relay: Relay | None) -> Relay:
        """Rank 0 passes what it received; every rank gets it back."""
        enc, dec = self._codec_relay
        data = self.group.broadcast_bytes(enc.encode(relay) if relay is not None else None, 0)
        return relay if relay is not None else dec.decode(data)

    def after_step(self, scheduler: Scheduler) -> None:
        if self.check:
            self.check_agreement(scheduler)

    def check_agreement(self, scheduler: Scheduler) -> None:
        """All-gather every rank's state digest; LockstepError naming the ranks that differ."""
        digest = torch.tensor([state_digest(scheduler)], dtype=torch.int64)
        every = self.group.all_gather(digest.to(self.group.device), dim=0).cpu().tolist()
        diverged = [rank for rank, d in enumerate(every) if d != every[0]]
        if diverged:
            ranks = ", ".join(str(r) for r in diverged)
            raise LockstepError(
                f"tensor-parallel rank(s) {ranks} diverged from rank 0 after step "
                f"{scheduler.stats.steps}: their running requests, radix tree or page "
                "tables differ"
            )


class Leader(TensorParallel):
    """Rank 0: it alone hears the frontend, compiles grammars and samples, and relays each
    turn and each sampling outcome to the others."""

    logs_stats = True

    def __init__(self, group: TPGroup, check: bool, local_ranks: range) -> None:
        super().__init__(group, check, local_ranks)
        self._messages: list[bytes] = []  # this turn's, relayed at its end

    def receive(self, transport: Transport, timeout: float | None) -> list[bytes]:
        if timeout is None or timeout > self.idle_wait_s:
            timeout = self.idle_wait_s
        self._messages = transport.recv(timeout=timeout)
        return self._messages

    def end_turn(self, structured: StructuredGeneration, stopped: bool) -> Turn:
        compiled = structured.take_compiled()
        ready = [r.arrival_order for r in compiled.ready]
        refused = [r.arrival_order for r, _ in compiled.failed]
        self.relay(Relay(self._messages, ready, refused, stopped))
        return Turn(compiled, stopped)

    def sample(
        self, batch: ScheduleBatch, logits: torch.Tensor, outputs: OutputProcessor, kv: KVManager
    ) -> None:
        lengths = [len(r.output_ids) - r.unverified for r in batch.reqs]  # drafts may go
        outputs.process(batch.logits, logits)
        self.share_outcome(batch, lengths)

    def share_outcome(self, batch: ScheduleBatch, lengths: list[int]) -> None:
        """After sampling: tell the others what each request of the batch became."""
        outcomes = [_outcome_of(req, n) for req, n in zip(batch.reqs, lengths, strict=True)]
        self.group.broadcast_bytes(msgspec.msgpack.encode(outcomes), 0)


class Follower(TensorParallel):
    """A rank > 0: it handles what rank 0 relays, holds constrained requests until rank 0
    has their grammar, and takes rank 0's sampling outcomes; it sends nothing."""

    logs_stats = False

    def __init__(self, group: TPGroup, check: bool, local_ranks: range) -> None:
        super().__init__(group, check, local_ranks)
        self._held: dict[int, Req] = {}  # constrained requests until rank 0 takes them
        self._relayed = Relay([], [], [])  # this turn's
        self._outcomes = msgspec.msgpack.Decoder(list[Outcome])

    def receive(self, transport: Transport, timeout: float | None) -> list[bytes]:
        self._relayed = self.relay(None)
        return self._relayed.messages

    def end_turn(self, structured: StructuredGeneration, stopped: bool) -> Turn:
        return Turn(Compiled(self.release_held(self._relayed), []), self._relayed.stop)

    def submit(self, req: Req, structured: StructuredGeneration) -> bool:
        return self.hold(req)

    def cancel(self, rid: str, structured: StructuredGeneration) -> list[Req]:
        """Rank 0 tells the client; nothing here was submitted to `structured`."""
        for order in [o for o, r in self._held.items() if r.rid == rid]:
            del self._held[order]
        return []

    def hold(self, req: Req) -> bool:
        """Keep a constrained request until rank 0 says its grammar compiled; False (nothing
        done) if it has no constraint."""
        if constraint_of(req.sampling_params) is None:
            return False
        self._held[req.arrival_order] = req
        return True

    def release_held(self, relay: Relay) -> list[Req]:
        """The held requests rank 0 took, in its order, with a stand-in matcher; those it
        refused are forgotten (it has told the client)."""
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

    def sample(
        self, batch: ScheduleBatch, logits: torch.Tensor, outputs: OutputProcessor, kv: KVManager
    ) -> None:
        """Instead of sampling: take rank 0's outcome of every request."""
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
            req.unverified, req.draft_kind = out.unverified, out.draft_kind


def _outcome_of(req: Req, length_before: int) -> Outcome:
    # Sampling only drops ids from the end (drafts, a failed token) and appends.
    keep = min(length_before, len(req.output_ids))
    return Outcome(
        keep,
        req.output_ids[keep:],
        req.finish_reason,
        req.failed,
        req.num_slots,
        req.unverified,
        req.draft_kind,
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
) -> tuple[TPGroup | None, Lockstep]:
    """This rank's group (None at tp_size 1: no collectives) and lockstep. On CUDA rank r of a
    node takes its device r; gloo runs on the CPU."""
    if args.tp_size == 1:
        return None, SingleRank()
    assert init_method is not None, "processes.py gives every rank the rendezvous address"
    per_node = args.tp_size // args.nnodes
    device = resolve_device(args.device)
    if device.startswith("cuda"):
        device = f"cuda:{rank % per_node}"
        torch.cuda.set_device(device)
    group = init_tp_group(rank, args.tp_size, init_method, device, args.dist_timeout)
    node = rank // per_node
    local = range(node * per_node, (node + 1) * per_node)
    role = Leader if group.is_leader else Follower
    return group, role(group, args.enable_kv_checks, local)
