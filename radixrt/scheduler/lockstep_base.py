"""How the scheduler takes part in tensor parallelism, bound once when it is built: the
`Lockstep` interface, and `SingleRank`, the implementation without tensor parallelism (rank 0's
and the other ranks' are in lockstep.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch

    from radixrt.ipc.transport import Transport
    from radixrt.scheduler.kv_manager import KVManager
    from radixrt.scheduler.output import OutputProcessor
    from radixrt.scheduler.req import Req
    from radixrt.scheduler.schedule_batch import ScheduleBatch
    from radixrt.scheduler.scheduler import Scheduler
    from radixrt.scheduler.structured import Compiled, StructuredGeneration


class Turn(NamedTuple):
    """The end of one turn of the loop: constrained requests to schedule or refuse, and
    whether to stop."""

    compiled: Compiled
    stop: bool


class Lockstep(Protocol):
    """One rank's part in tensor parallelism. Each turn the scheduler calls `receive`, handles
    what it returns, then calls `end_turn`; each step it calls `sample`, then `after_step`."""

    logs_stats: bool  # whether this rank writes the periodic stats line

    def receive(self, transport: Transport, timeout: float | None) -> list[bytes]:
        """This turn's messages, in the order every rank handles them."""

    def end_turn(self, structured: StructuredGeneration, stopped: bool) -> Turn:
        """After this turn's messages were handled (`stopped`: one said to stop)."""

    def submit(self, req: Req, structured: StructuredGeneration) -> bool:
        """Hold a constrained request until its grammar is ready; False (nothing done) if it
        has no constraint."""

    def cancel(self, rid: str, structured: StructuredGeneration) -> list[Req]:
        """Stop holding the requests of `rid`; returns those whose client is to be told."""

    def sample(
        self, batch: ScheduleBatch, logits: torch.Tensor, outputs: OutputProcessor, kv: KVManager
    ) -> None:
        """Settle each request of the batch after its forward: sample, or take rank 0's."""

    def after_step(self, scheduler: Scheduler) -> None:
        """LockstepError if the ranks no longer agree (checked only with KV checks on)."""

    def join(self) -> None:
        """Once every rank has built its model."""

    def close(self) -> None:
        """After the loop has ended."""

    def failure_message(self, error: BaseException) -> str:
        """What the frontend is told of the error that ended this scheduler."""


class SingleRank:
    """No tensor parallelism: the scheduler alone decides, with no collectives."""

    logs_stats = True

    def receive(self, transport: Transport, timeout: float | None) -> list[bytes]:
        return transport.recv(timeout=timeout)

    def end_turn(self, structured: StructuredGeneration, stopped: bool) -> Turn:
        return Turn(structured.take_compiled(), stopped)

    def submit(self, req: Req, structured: StructuredGeneration) -> bool:
        return structured.submit(req)

    def cancel(self, rid: str, structured: StructuredGeneration) -> list[Req]:
        return structured.cancel(rid)

    def sample(
        self, batch: ScheduleBatch, logits: torch.Tensor, outputs: OutputProcessor, kv: KVManager
    ) -> None:
        outputs.process(batch.logits, logits)

    def after_step(self, scheduler: Scheduler) -> None:
        pass

    def join(self) -> None:
        pass

    def close(self) -> None:
        pass

    def failure_message(self, error: BaseException) -> str:
        return str(error)
