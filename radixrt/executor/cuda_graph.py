"""Decode steps replayed from CUDA graphs: one graph per batch size in a fixed set.

A decode step launches a few kernels per layer on tiny tensors; on a GPU the launches, not the
math, take most of its time. So the model's decode forward is captured once per batch size in
`graph_batch_sizes(max_bs)` (at start-up, after the KV pool is allocated) and replayed: a batch
of B sequences runs the graph of the smallest captured size >= B, its inputs copied into the
graph's static buffers and the rows past B padded. A padding row has no keys (kv length 0, so
attention gives 0) and writes its K/V nowhere (slot -1, which the Triton store skips).

The attention backend must be able to run under a graph (`supports_cuda_graph`): its metadata
for a captured batch depends on the batch size only (`init_graph_metadata`), and its kernels
read the index tensors given at capture, whose contents change between replays.
"""

from __future__ import annotations

import bisect
import logging

import torch

from radixrt.attention.base import AttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.executor.forward_batch import ForwardBatch

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
    """The static input buffers every captured graph reads, sized for max_bs sequences whose
    slot lists hold at most `index_capacity` entries in all."""

    def __init__(self, max_bs: int, index_capacity: int, device: torch.device) -> None:
        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, device=device)

        self.max_bs = max_bs
        self.index_capacity = index_capacity
        self.input_ids = zeros(max_bs)
        self.positions = zeros(max_bs)
        self.out_cache_loc = torch.full((max_bs,), -1, dtype=torch.int64, device=device)
        self.seq_lens = zeros(max_bs)
        self.kv_indptr = zeros(max_bs + 1)  # all sequences empty until a batch is loaded
        self.kv_indices = zeros(index_capacity)
        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int64, device=device)
        self.extend_lens = torch.ones(max_bs, dtype=torch.int64, device=device)

    def fits(self, fb: ForwardBatch) -> bool:
        return (fb.is_decode_only and fb.batch_size <= self.max_bs
                and fb.kv_indices.numel() <= self.index_capacity)

    def load(self, fb: ForwardBatch, padded_bs: int) -> None:
        """Copy a decode batch of B <= padded_bs sequences in; rows B..padded_bs-1 become
        padding (no keys, no KV write). Device-to-device copies only: no sync."""
        bs, n = fb.batch_size, fb.kv_indices.numel()
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        self.out_cache_loc[bs:padded_bs].fill_(-1)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        self.seq_lens[bs:padded_bs].fill_(0)
        self.kv_indptr[: bs + 1].copy_(fb.kv_indptr)
        self.kv_indptr[bs + 1 : padded_bs + 1].fill_(n)
        self.kv_indices[:n].copy_(fb.kv_indices)

    def batch(self, bs: int, kv_pool: KVPool, backend: AttentionBackend) -> ForwardBatch:
        """A ForwardBatch of `bs` decode rows over views of the static buffers."""
        return ForwardBatch(
            input_ids=self.input_ids[:bs], positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs], qo_indptr=self.qo_indptr[: bs + 1],
            kv_indices=self.kv_indices, kv_indptr=self.kv_indptr[: bs + 1],
            seq_lens=self.seq_lens[:bs], extend_lens=self.extend_lens[:bs],
            # Lengths as the graph sees them at capture; replays never read these lists.
            seq_lens_cpu=[1] * bs, extend_lens_cpu=[1] * bs, prefix_lens_cpu=[0] * bs,
            kv_pool=kv_pool, attn_backend=backend,
        )  # fmt: skip


class CudaGraphRunner:
    """Captures the model's decode forward for every size in graph_batch_sizes(max_bs) and
    replays it. `model(input_ids, positions, fb) -> hidden [T, hidden]` (the model API)."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_pool: KVPool,
        backend: AttentionBackend,
        max_bs: int,
        device: torch.device,
    ) -> None:
        assert backend.supports_cuda_graph and device.type == "cuda"
        self.model = model
        self.kv_pool = kv_pool
        self.backend = backend
        self.sizes = graph_batch_sizes(max_bs)
        # Without prefix sharing a batch's slot lists fit in the pool; a batch sharing more
        # than that falls back to eager.
        self.inputs = GraphInputs(self.sizes[-1], kv_pool.size, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # [bs, hidden] written by each replay
        self._capture_all()

    def can_run(self, fb: ForwardBatch) -> bool:
        return self.inputs.fits(fb)

    def replay(self, fb: ForwardBatch) -> torch.Tensor:  # [B, hidden]
        """The model's hidden states for a decode batch that `can_run`."""
        padded = padded_batch_size(fb.batch_size, self.sizes)
        assert padded is not None
        self.inputs.load(fb, padded)
        self.graphs[padded].replay()
        return self.outputs[padded][: fb.batch_size]

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None  # one memory pool for all graphs: the largest is captured first
        for bs in reversed(self.sizes):
            fb = self.inputs.batch(bs, self.kv_pool, self.backend)
            self.backend.init_graph_metadata(fb)
            for _ in range(2):  # compile the Triton kernels, settle the allocator
                self.model(fb.input_ids, fb.positions, fb)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self.model(fb.input_ids, fb.positions, fb)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)
