"""Runs the model over one scheduled step: builds the flat index tensors on the device from the
request-to-token table, forwards, returns the logits of the rows the step needs."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from radixrt.attention.base import AttentionBackend
from radixrt.attention.forward_batch import ForwardBatch, StepInput
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.executor.compiled_forward import CompiledDecoderForward, can_compile
from radixrt.executor.cuda_graph import CudaGraphRunner
from radixrt.executor.step_threads import StepThreads

if TYPE_CHECKING:
    from radixrt.models.base import CausalLM

logger = logging.getLogger(__name__)


class ModelRunner:
    """Decode steps run from CUDA graphs when the model is on CUDA, the backend supports them,
    and `disable_cuda_graph` is off (graphs for batches of up to `cuda_graph_max_bs`, captured
    here). On the CPU, `enable_torch_compile` runs steps of up to `torch_compile_max_bs` new
    tokens (decode batches of that size, short chunks) through torch.compile'd graphs
    (compiled_forward.py, built here); everything else runs eagerly.

    Eager CPU steps of fewer than `ADAPTIVE_THREADS_BELOW` new tokens (decode batches) run on
    one thread or on all of torch's, whichever has been faster lately (step_threads.py): under
    contention one thread is several times faster. Wider steps are compute-bound and keep
    every thread; compiled steps keep the count their kernels were compiled for."""

    ADAPTIVE_THREADS_BELOW = 32

    def __init__(
        self,
        model: CausalLM,
        kv_pool: KVPool,
        attn_backend: AttentionBackend,
        table: ReqToTokenTable,
        device: str,
        disable_cuda_graph: bool = False,
        cuda_graph_max_bs: int = 64,
        enable_torch_compile: bool = False,
        torch_compile_max_bs: int = 32,
    ) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.attn_backend = attn_backend
        self.table = table
        self.device = torch.device(device)
        self.graph_runner: CudaGraphRunner | None = None
        if (
            self.device.type == "cuda"
            and not disable_cuda_graph
            and attn_backend.supports_cuda_graph
            and model.static_graphs
        ):
            self.graph_runner = CudaGraphRunner(
                model, kv_pool, attn_backend, table, cuda_graph_max_bs, self.device
            )
        self.compiled: CompiledDecoderForward | None = None
        self.torch_compile_max_bs = torch_compile_max_bs
        if enable_torch_compile:
            self.compiled = _compiled_forward(model, self.device, torch_compile_max_bs)
        adaptive = self.device.type == "cpu" and self.compiled is None
        self.step_threads = StepThreads(torch.get_num_threads()) if adaptive else None

    def build_batch(self, step: StepInput) -> ForwardBatch:
        """The step's ForwardBatch: lengths and tokens come from the host (a few small copies),
        every slot index from the table on the device (a gather)."""
        self.table.flush()
        prefix, extend = list(step.prefix_lens), list(step.extend_lens)
        seq_lens = [p + n for p, n in zip(prefix, extend, strict=True)]
        positions: list[int] = []
        for p, n in zip(prefix, extend, strict=True):
            positions.extend(range(p, p + n))
        dev = self.device
        rows = torch.tensor(step.table_rows, dtype=torch.int64, device=dev)
        extend_t = torch.tensor(extend, dtype=torch.int64, device=dev)
        positions_t = torch.tensor(positions, dtype=torch.int64, device=dev)
        kv_indptr = _indptr(seq_lens, dev)
        token_rows = rows.repeat_interleave(extend_t, output_size=len(positions))
        return ForwardBatch(
            input_ids=torch.tensor(step.input_ids, dtype=torch.int64, device=dev),
            positions=positions_t,
            out_cache_loc=self.table.lookup(token_rows, positions_t),
            qo_indptr=_indptr(extend, dev),
            kv_indices=self.table.gather(rows, kv_indptr, sum(seq_lens)),
            kv_indptr=kv_indptr,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            extend_lens=extend_t,
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=extend,
            prefix_lens_cpu=prefix,
            kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
            rope_lens=_rope_lens(step, seq_lens, dev),
        )

    def forward(self, step: StepInput) -> torch.Tensor:
        """Forward the step and return float32 logits [len(step.logit_rows), vocab]."""
        tokens = len(step.input_ids)
        policy = self.step_threads
        if policy is None or tokens >= self.ADAPTIVE_THREADS_BELOW:
            return self._forward(step)
        threads = policy.choose(tokens)
        torch.set_num_threads(threads)
        start = time.perf_counter()
        try:
            return self._forward(step)
        finally:
            policy.record(tokens, threads, time.perf_counter() - start)
            torch.set_num_threads(policy.max_threads)

    @torch.inference_mode()
    def _forward(self, step: StepInput) -> torch.Tensor:
        if self.graph_runner is not None and self.graph_runner.can_run(step):
            self.table.flush()
            hidden = self.graph_runner.replay(step)
        else:
            fb = self.build_batch(step)
            self.attn_backend.init_forward_metadata(fb)
            hidden = self._forward_model(fb)
        rows = torch.tensor(step.logit_rows, dtype=torch.int64, device=hidden.device)
        return self.model.compute_logits(hidden.index_select(0, rows))

    def _forward_model(self, fb: ForwardBatch) -> torch.Tensor:
        compiled = self.compiled
        if compiled is not None and len(fb.input_ids) <= self.torch_compile_max_bs:
            return compiled(fb.input_ids, fb.positions, fb)
        hidden: torch.Tensor = self.model(fb.input_ids, fb.positions, fb)
        return hidden


def _compiled_forward(
    model: CausalLM, device: torch.device, max_tokens: int
) -> CompiledDecoderForward | None:
    """The compiled forward, warmed up; None (with a warning) where it does not apply."""
    if device.type != "cpu":
        # CUDA keeps its CUDA graphs; compiling the kernels they capture is not done here.
        logger.warning("--enable-torch-compile is ignored on %s: it compiles CPU steps", device)
        return None
    if not can_compile(model):
        name = type(model).__name__
        logger.warning("--enable-torch-compile is ignored: %s is not the shared decoder", name)
        return None
    compiled = CompiledDecoderForward(model)
    compiled.warm_up(max_tokens)
    return compiled


def _rope_lens(step: StepInput, seq_lens: list[int], device: torch.device) -> torch.Tensor | None:
    """The step's rope_lens on the device where they differ from seq_lens (a prefill chunk)."""
    lens = step.rope_lens
    if lens is None or list(lens) == seq_lens:
        return None
    return torch.tensor(lens, dtype=torch.int64, device=device)


def _indptr(lengths: list[int], device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out.to(device)
