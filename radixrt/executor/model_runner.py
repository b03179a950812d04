"""Runs the model over one scheduled step: flattens the ragged batch, forwards, returns logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.attention.base import AttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.executor.cuda_graph import CudaGraphRunner
from radixrt.executor.forward_batch import ForwardBatch


@dataclass(frozen=True)
class SeqWork:
    """One sequence's share of a step: compute its positions start..start+n-1 (`new_ids`) into
    `slots[start:start+n]`."""

    new_ids: list[int]  # the n tokens at positions start..start+n-1
    slots: torch.Tensor  # [>= start + n] int64 pool slots of positions 0..
    start: int
    n: int


class ModelRunner:
    """Decode steps run from CUDA graphs when the model is on CUDA, the backend supports them,
    and `disable_cuda_graph` is off (graphs for batches of up to `cuda_graph_max_bs`, captured
    here); everything else runs eagerly."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_pool: KVPool,
        attn_backend: AttentionBackend,
        device: str,
        disable_cuda_graph: bool = False,
        cuda_graph_max_bs: int = 64,
    ) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.attn_backend = attn_backend
        self.device = torch.device(device)
        self.graph_runner: CudaGraphRunner | None = None
        if (self.device.type == "cuda" and not disable_cuda_graph
                and attn_backend.supports_cuda_graph):
            self.graph_runner = CudaGraphRunner(model, kv_pool, attn_backend, cuda_graph_max_bs,
                                                self.device)

    def build_batch(self, work: list[SeqWork]) -> ForwardBatch:
        ids: list[int] = []
        positions: list[int] = []
        for w in work:
            ids.extend(w.new_ids)
            positions.extend(range(w.start, w.start + w.n))
        seq_lens = [w.start + w.n for w in work]
        extend_lens = [w.n for w in work]
        kv_indices = torch.cat([w.slots[: w.start + w.n] for w in work])
        out_loc = torch.cat([w.slots[w.start: w.start + w.n] for w in work])
        dev = self.device
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            out_cache_loc=out_loc.to(dev),
            qo_indptr=_indptr(extend_lens, dev),
            kv_indices=kv_indices.to(dev),
            kv_indptr=_indptr(seq_lens, dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            extend_lens=torch.tensor(extend_lens, dtype=torch.int64, device=dev),
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=extend_lens,
            prefix_lens_cpu=[w.start for w in work],
            kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
        )

    @torch.inference_mode()
    def forward(self, work: list[SeqWork], logit_rows: list[int]) -> torch.Tensor:
        """Forward the step and return float32 logits [len(logit_rows), vocab] for the given
        rows (indices into the step's flattened new tokens)."""
        fb = self.build_batch(work)
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            hidden = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            hidden = self.model(fb.input_ids, fb.positions, fb)
        rows = torch.tensor(logit_rows, dtype=torch.int64, device=hidden.device)
        return self.model.compute_logits(hidden.index_select(0, rows))


def _indptr(lengths: list[int], device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out.to(device)
