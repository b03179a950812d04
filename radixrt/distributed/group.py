"""One rank's view of its tensor-parallel group."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from radixrt.errors import RankDied


@dataclass(frozen=True)
class TPGroup:
    rank: int
    size: int
    device: torch.device
    timeout_s: float = 60.0

    @classmethod
    def single(cls, device: torch.device | str = "cpu") -> TPGroup:
        return cls(0, 1, torch.device(device))

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place (row-parallel layers' partial products)."""
        if self.size > 1:
            self._wait(dist.all_reduce(t, async_op=True), "all_reduce")
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `t` (same shape on each), concatenated along `dim` in rank order."""
        if self.size == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(self.size)]
        self._wait(dist.all_gather(parts, t.contiguous(), async_op=True), "all_gather")
        return torch.cat(parts, dim=dim)

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        """`data` from rank `src` to every rank (the others pass None): a length, then the
        bytes, as uint8 tensors on the group's device."""
        if self.size == 1:
            assert data is not None
            return data
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        if self.rank == src:
            assert data is not None
            length[0] = len(data)
        self._wait(dist.broadcast(length, src, async_op=True), "broadcast")
        n = int(length.item())
        if n == 0:
            return b""
        if self.rank == src:
            assert data is not None
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            buf = torch.empty(n, dtype=torch.uint8, device=self.device)
        self._wait(dist.broadcast(buf, src, async_op=True), "broadcast")
        return data if data is not None else buf.cpu().numpy().tobytes()

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank `src`'s `t` into every rank's `t` (same shape and dtype), in place."""
        if self.size > 1:
            self._wait(dist.broadcast(t, src, async_op=True), "broadcast")
        return t

    def barrier(self) -> None:
        if self.size > 1:
            self._wait(dist.barrier(async_op=True), "barrier")

    def _wait(self, work: dist.Work | None, what: str) -> None:
        if work is None:
            return
        try:
            done = work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as e:  # gloo raises on a timeout or a closed peer connection
            raise RankDied(
                f"tensor-parallel {what} failed on rank {self.rank} of {self.size} "
                f"(a rank died or did not answer within {self.timeout_s:g} s): {e}"
            ) from e
        if done is False:
            raise RankDied(
                f"tensor-parallel {what} timed out on rank {self.rank} of {self.size} after "
                f"{self.timeout_s:g} s (a rank died or is stuck)"
            )


def init_tp_group(
    rank: int, size: int, init_method: str, device: torch.device | str, timeout_s: float = 60.0
) -> TPGroup:
    """Join the torch.distributed group (`init_method`: "tcp://HOST:PORT"); NCCL on CUDA,
    gloo on the CPU. size 1 joins nothing."""
    device = torch.device(device)
    if size == 1:
        return TPGroup(0, 1, device, timeout_s)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return TPGroup(rank, size, device, timeout_s)
