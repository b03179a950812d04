"""CUDA-graph decode: the batch-size set and padding choice, the padded static inputs (run
eagerly on the CPU through the Triton backend under the interpreter), and on a GPU the graphs
themselves against eager decode steps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the `test` extra installs it)")

from triton_device import interpreter_only  # noqa: E402

from radixrt.attention.forward_batch import SimpleStep  # noqa: E402
from radixrt.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from radixrt.cache.kv_pool import KVPool  # noqa: E402
from radixrt.cache.req_to_token import ReqToTokenTable  # noqa: E402
from radixrt.executor.cuda_graph import (  # noqa: E402
    GraphInputs,
    graph_batch_sizes,
    padded_batch_size,
)
from radixrt.executor.model_runner import ModelRunner  # noqa: E402
from radixrt.kernels.common import interpreting  # noqa: E402
from radixrt.loader.load import load_model  # noqa: E402

SLOTS_PER_SEQ = 64


def test_batch_sizes_and_padding():
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(12) == [1, 2, 4, 8, 12]
    sizes = graph_batch_sizes(20)
    padded = [padded_batch_size(b, sizes) for b in (1, 3, 5, 8, 9, 17, 20)]
    assert padded == [1, 4, 8, 8, 16, 20, 20]
    assert padded_batch_size(21, sizes) is None
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        graph_batch_sizes(0)


def slot_table(num_seqs: int, device: str) -> ReqToTokenTable:
    """Table row i maps positions 0.. of sequence i to slots i*64.. (scattered pages would do
    as well: only the table is read)."""
    table = ReqToTokenTable(num_seqs, SLOTS_PER_SEQ, device)
    for i in range(num_seqs):
        table.write(i, 0, torch.arange(i * SLOTS_PER_SEQ, (i + 1) * SLOTS_PER_SEQ))
    return table


def prefill_then_decode_step(runner: ModelRunner, prompts: list[list[int]]) -> SimpleStep:
    """Prefill the prompts (sequence i in table row i) and return their next decode step."""
    rows = list(range(len(prompts)))
    flat = [t for p in prompts for t in p]
    runner.forward(SimpleStep(rows, [0] * len(prompts), [len(p) for p in prompts], flat, [0]))
    return decode_step([len(p) for p in prompts], [7 + i for i in rows])


def decode_step(prefix_lens: list[int], tokens: list[int]) -> SimpleStep:
    rows = list(range(len(tokens)))
    return SimpleStep(rows, prefix_lens, [1] * len(tokens), tokens, rows)


@interpreter_only
def test_padded_inputs_match_eager_decode(tiny_model_dir):
    """A decode batch of 3 loaded into the static buffers of the size-4 graph and run (eagerly,
    as the graph would): the same hidden states, a padding row of zeros-attention that writes
    no KV."""
    model, cfg = load_model(tiny_model_dir("llama"), torch.float32, "cpu")
    pool = KVPool(
        4 * SLOTS_PER_SEQ, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu"
    )
    backend = TritonAttentionBackend(device="cpu")
    table = slot_table(4, "cpu")
    runner = ModelRunner(model, pool, backend, table, "cpu")
    step = prefill_then_decode_step(runner, [[3, 4, 5, 6, 7], list(range(10, 29)), [9]])
    with torch.inference_mode():
        fb = runner.build_batch(step)
        backend.init_forward_metadata(fb)
        want = model(fb.input_ids, fb.positions, fb)
        kv_before = [t.clone() for t in pool.k_buffer + pool.v_buffer]
        inputs = GraphInputs(8, table, torch.device("cpu"))
        inputs.load(step, padded_batch_size(3, graph_batch_sizes(8)))
        inputs.prepare(4)  # what the graph runs before the model
        gfb = inputs.batch(4, pool, backend)
        assert gfb.out_cache_loc.tolist() == fb.out_cache_loc.tolist() + [-1]
        assert gfb.kv_indptr.tolist() == fb.kv_indptr.tolist() + [fb.kv_indptr[-1].item()]
        n = fb.kv_indices.numel()
        assert gfb.kv_indices[:n].tolist() == fb.kv_indices.tolist()
        backend.init_graph_metadata(gfb)
        got = model(gfb.input_ids, gfb.positions, gfb)
    torch.testing.assert_close(got[:3], want, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got).all()
    # The real rows rewrote their own K/V (the same up to rounding: the split count differs
    # from eager); the padding row wrote nothing.
    others = torch.ones(pool.size, dtype=torch.bool)
    others[fb.out_cache_loc] = False
    for after, before in zip(pool.k_buffer + pool.v_buffer, kv_before, strict=True):
        assert torch.equal(after[others], before[others])
        torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or interpreting(),
    reason="needs a CUDA device; run with TRITON_INTERPRET=0",
)
def test_graph_replay_matches_eager_on_gpu(tiny_model_dir):
    model, cfg = load_model(tiny_model_dir("llama"), torch.float16, "cuda")
    logits = {}
    for disable in (True, False):
        pool = KVPool(
            16 * SLOTS_PER_SEQ,
            cfg.num_layers,
            cfg.num_kv_heads,
            cfg.head_dim,
            torch.float16,
            "cuda",
        )
        runner = ModelRunner(
            model,
            pool,
            TritonAttentionBackend(device="cuda"),
            slot_table(16, "cuda"),
            "cuda",
            disable_cuda_graph=disable,
            cuda_graph_max_bs=8,
        )
        assert (runner.graph_runner is None) == disable
        prompts = [list(range(3, 3 + n)) for n in (5, 40, 1)]  # batch 3: padded to 4
        step = prefill_then_decode_step(runner, prompts)
        steps = []
        for _ in range(3):
            steps.append(runner.forward(step))
            step = decode_step([p + 1 for p in step.prefix_lens], [9] * 3)
        logits[disable] = torch.stack(steps)
    torch.testing.assert_close(logits[False], logits[True], atol=2e-2, rtol=2e-2)
