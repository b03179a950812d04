"""The request-to-token table: which pool slot holds each position of each running request.

One int32 table on the model's device, [num_rows, context_length]: row r, column p is the pool
slot of position p of the request holding row r. The radix cache and the allocator own the
pages; this table is only the map, so the model runner can build a step's index tensors on the
device with a gather (and a CUDA graph needs only rows and lengths), instead of concatenating
per-request slot lists on the CPU every step.

The scheduler's own reads (what to publish to the cache, which pages to free) come from a host
copy, so they never wait for the device; on a GPU, writes go to the host copy at once and are
queued for the device, applied in one scatter (`flush`) before a forward reads the table: a
step with many growing requests costs one host-to-device copy, not one per request.
"""

from __future__ import annotations

import torch


class ReqToTokenTable:
    def __init__(self, num_rows: int, context_length: int, device: str | torch.device) -> None:
        assert num_rows > 0 and context_length > 0, (num_rows, context_length)
        self.num_rows = num_rows
        self.context_length = context_length
        self.device = torch.device(device)
        shape = (num_rows, context_length)
        self.table = torch.zeros(shape, dtype=torch.int32, device=self.device)
        on_cpu = self.device.type == "cpu"
        self._host = self.table if on_cpu else torch.zeros(shape, dtype=torch.int32)
        self._queue_writes = not on_cpu
        self._free_rows = list(range(num_rows - 1, -1, -1))  # pops 0, 1, 2, ...
        # Queued writes: (row, first position, slots int64 [n] on the CPU).
        self._pending: list[tuple[int, int, torch.Tensor]] = []

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        """A free row; the caller checked `num_free_rows` (one row per running request)."""
        assert self._free_rows, "no free row in the request-to-token table"
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        assert 0 <= row < self.num_rows and row not in self._free_rows, row
        self._pending = [w for w in self._pending if w[0] != row]
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Positions start.. of `row` now live at `slots` (int64 [n], CPU); the device table
        has them after the next `flush`."""
        end = start + slots.numel()
        assert start >= 0 and end <= self.context_length, (start, end, self.context_length)
        self._host[row, start:end] = slots
        if self._queue_writes and slots.numel():
            self._pending.append((row, start, slots))

    def flush(self) -> None:
        """Apply every queued write to the device table, in one scatter."""
        if not self._pending:
            return
        rows = torch.cat(
            [torch.full((s.numel(),), r, dtype=torch.int64) for r, _, s in self._pending]
        )
        cols = torch.cat(
            [torch.arange(p, p + s.numel(), dtype=torch.int64) for _, p, s in self._pending]
        )
        slots = torch.cat([s for _, _, s in self._pending]).to(torch.int32)
        self._pending.clear()
        dev = self.device
        self.table[rows.to(dev), cols.to(dev)] = slots.to(dev)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """Slots of positions start..end-1 of `row`, int64 [end - start] on the CPU (from the
        host copy: no device sync)."""
        return self._host[row, start:end].to(torch.int64)

    def gather(self, rows: torch.Tensor, indptr: torch.Tensor, count: int) -> torch.Tensor:
        """The slots of positions 0.. of each row, flattened: entry indptr[i] + j is position j
        of rows[i] (int64 [count], on the device). `indptr` [B+1] holds the offsets of the
        rows' position counts; entries past indptr[B] (a fixed `count` under a CUDA graph) are
        padding that nothing reads. Device ops only: no sync."""
        j = torch.arange(count, dtype=torch.int64, device=rows.device)
        seq = torch.searchsorted(indptr[1:], j, right=True).clamp_(max=rows.numel() - 1)
        col = (j - indptr[seq]).clamp_(0, self.context_length - 1)
        return self.table[rows[seq], col].to(torch.int64)

    def lookup(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The slot of positions[i] of rows[i], int64 [T] on the device."""
        return self.table[rows, positions].to(torch.int64)
