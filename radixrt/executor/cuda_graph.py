"""Decode steps replayed from CUDA graphs: one graph per batch size in a fixed set.

A decode step launches a few kernels per layer on tiny tensors; on a GPU the launches, not the
math, take most of its time. So the model's decode forward is captured once per batch size in
`graph_batch_sizes(max_bs)` (at start-up, after the KV pool is allocated) and replayed: a batch
of B sequences runs the graph of the smallest captured size >= B. Its inputs are only tokens,
request-to-token table rows and lengths, copied into the graph's static buffers (rows past B
padded); the graph itself derives the positions and gathers every slot index from the table,
so no batch is too large for a graph's index buffers. A padding row has no keys (kv length 0,
so attention gives 0) and writes its K/V nowhere (slot -1, which the Triton store skips).

The attention backend must be able to run under a graph (`supports_cuda_graph`): its metadata
for a captured batch depends on the batch size only (`init_graph_metadata`), and its kernels
read the index tensors given at capture, whose contents change between replays.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from radixrt.attention.base import AttentionBackend
from radixrt.attention.forward_batch import ForwardBatch, StepInput
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable

if TYPE_CHECKING:
    from radixrt.models.base import CausalLM

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    """The captured batch sizes: 1, 2, 4, 8, then every multiple of 8, up to and including
    max_bs. Padding wastes at most 7 rows past 8, and the count of graphs stays small."""
    if max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
    sizes = [s for s in (1, 2, 4) if s < max_bs] + list(range(8, max_bs, 8))
    return sizes + [max_bs]


def padded_batch_size(batch_size: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds `batch_size` rows; None if none does."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None


class GraphInputs:
    """The static buffers every captured graph reads: per sequence (up to max_bs) its token,
    table row and length, and what `prepare` derives from them (positions, slots, offsets)."""

    def __init__(self, max_bs: int, table: ReqToTokenTable, device: torch.device) -> None:
        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, device=device)

        self.max_bs = max_bs
        self.table = table
        self.input_ids = zeros(max_bs)
        self.rows = zeros(max_bs)
        self.seq_lens = zeros(max_bs)
        self.positions = zeros(max_bs)
        self.out_cache_loc = torch.full((max_bs,), -1, dtype=torch.int64, device=device)
        self.kv_indptr = zeros(max_bs + 1)  # all sequences empty until a batch is loaded
        # Every sequence's slots, laid out in turn: at most a whole table row each.
        self.kv_indices = zeros(max_bs * table.context_length)
        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int64, device=device)
        self.extend_lens = torch.ones(max_bs, dtype=torch.int64, device=device)

    def fits(self, step: StepInput) -> bool:
        return len(step.extend_lens) <= self.max_bs and all(n == 1 for n in step.extend_lens)

    def load(self, step: StepInput, padded_bs: int) -> None:
        """Copy a decode step of B <= padded_bs sequences in; rows B..padded_bs-1 become
        padding (length 0: no keys, no KV write). Three small host-to-device copies."""
        bs = len(step.extend_lens)
        pad = padded_bs - bs
        lens = [p + 1 for p in step.prefix_lens] + [0] * pad
        for buf, values in (
            (self.input_ids, list(step.input_ids) + [0] * pad),
            (self.rows, list(step.table_rows) + [0] * pad),
            (self.seq_lens, lens),
        ):
            buf[:padded_bs].copy_(torch.tensor(values, dtype=torch.int64))

    def prepare(self, bs: int) -> None:
        """Derive positions, slots and offsets of the first `bs` sequences from their rows and
        lengths (inside the graph: device ops on static buffers)."""
        lens, rows = self.seq_lens[:bs], self.rows[:bs]
        self.kv_indptr[1 : bs + 1].copy_(lens.cumsum(0))
        self.positions[:bs].copy_((lens - 1).clamp(min=0))
        slots = self.table.lookup(rows, self.positions[:bs])
        self.out_cache_loc[:bs].copy_(torch.where(lens > 0, slots, -1))
        count = bs * self.table.context_length
        self.kv_indices[:count].copy_(self.table.gather(rows, self.kv_indptr[: bs + 1], count))

    def batch(self, bs: int, kv_pool: KVPool, backend: AttentionBackend) -> ForwardBatch:
        """A ForwardBatch of `bs` decode rows over views of the static buffers."""
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            kv_indices=self.kv_indices,
            kv_indptr=self.kv_indptr[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            extend_lens=self.extend_lens[:bs],
            # Lengths as the graph sees them at capture; replays never read these lists.
            seq_lens_cpu=[1] * bs,
            extend_lens_cpu=[1] * bs,
            prefix_lens_cpu=[0] * bs,
            kv_pool=kv_pool,
            attn_backend=backend,
        )


class CudaGraphRunner:
    """Captures the model's decode forward for every size in graph_batch_sizes(max_bs) and
    replays it. `model(input_ids, positions, fb) -> hidden [T, hidden]` (the model API)."""

    def __init__(
        self,
        model: CausalLM,
        kv_pool: KVPool,
        backend: AttentionBackend,
        table: ReqToTokenTable,
        max_bs: int,
        device: torch.device,
    ) -> None:
        assert backend.supports_cuda_graph and device.type == "cuda"
        self.model = model
        self.kv_pool = kv_pool
        self.backend = backend
        self.sizes = graph_batch_sizes(max_bs)
        self.inputs = GraphInputs(self.sizes[-1], table, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # [bs, hidden] written by each replay
        self._capture_all()

    def can_run(self, step: StepInput) -> bool:
        return self.inputs.fits(step)

    def replay(self, step: StepInput) -> torch.Tensor:  # [B, hidden]
        """The model's hidden states for a decode step that `can_run` (the table flushed)."""
        bs = len(step.extend_lens)
        padded = padded_batch_size(bs, self.sizes)
        assert padded is not None
        self.inputs.load(step, padded)
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None  # one memory pool for all graphs: the largest is captured first
        for bs in reversed(self.sizes):
            fb = self.inputs.batch(bs, self.kv_pool, self.backend)
            self.backend.init_graph_metadata(fb)
            for _ in range(2):  # compile the Triton kernels, settle the allocator
                self._run(bs, fb)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self._run(bs, fb)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def _run(self, bs: int, fb: ForwardBatch) -> torch.Tensor:
        self.inputs.prepare(bs)
        hidden: torch.Tensor = self.model(fb.input_ids, fb.positions, fb)
        return hidden
