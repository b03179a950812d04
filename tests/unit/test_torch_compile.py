"""--enable-torch-compile on the CPU: the compiled forward gives eager's greedy tokens, token for
token, and logits within float32 rounding, over a mixed workload (prefills of several lengths,
a mixed prefill + decode step, a prefix-cache hit, decode batches of varying size); and it
does so from the graphs built at warm-up, without recompiling per size."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.executor.compiled_forward import can_compile
from radixrt.executor.forward_batch import SimpleStep
from radixrt.executor.model_runner import ModelRunner
from radixrt.layers.decoder import DecoderLayer
from radixrt.loader.load import load_model

MAX_BS = 32  # steps of up to this many new tokens run compiled
ROW_SLOTS = 128  # table row r owns pool slots r*128 .. (except a shared prefix)
SHARED = 16  # row 3's prompt starts with row 0's first 16 tokens, cached in row 0's slots
# Same weights, same float32 math, but inductor fuses and reorders the reductions (norm
# statistics): logits agree to float32 rounding accumulated over the layers.
ATOL = 1e-4


@dataclass
class Seq:
    row: int
    tokens: list[int]
    cached: int = 0
    generated: list[int] = field(default_factory=list)


def _prompt(length: int, seed: int) -> list[int]:
    return torch.randint(3, 250, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _runner(model_dir: str, compiled: bool) -> ModelRunner:
    model, cfg = load_model(model_dir, torch.float32, "cpu")
    dims = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    pool = KVPool(8 * ROW_SLOTS, *dims, torch.float32, "cpu")
    table = ReqToTokenTable(8, ROW_SLOTS, "cpu")
    for row in range(8):
        table.write(row, 0, torch.arange(row * ROW_SLOTS, (row + 1) * ROW_SLOTS))
    table.write(3, 0, torch.arange(SHARED))  # the prefix-cache hit: row 0's slots
    return ModelRunner(
        model,
        pool,
        TorchAttentionBackend(),
        table,
        "cpu",
        enable_torch_compile=compiled,
        torch_compile_max_bs=MAX_BS,
    )


def _step(runner: ModelRunner, work: list[tuple[Seq, int]], logits: list[torch.Tensor]) -> None:
    """Feed each sequence its next n tokens (its prompt's, then its greedy ones); append the
    token each sequence's last row picks."""
    ids: list[int] = []
    rows: list[int] = []
    for seq, n in work:
        ids += seq.tokens[seq.cached : seq.cached + n]
        rows.append(len(ids) - 1)
    step = SimpleStep(
        [s.row for s, _ in work], [s.cached for s, _ in work], [n for _, n in work], ids, rows
    )
    out = runner.forward(step)
    logits.append(out)
    for (seq, n), row_logits in zip(work, out, strict=True):
        seq.cached += n
        if seq.cached == len(seq.tokens):
            token = int(row_logits.argmax())
            seq.tokens.append(token)
            seq.generated.append(token)


def _workload(runner: ModelRunner) -> tuple[list[list[int]], list[torch.Tensor]]:
    a, b, c = Seq(0, _prompt(20, 1)), Seq(1, _prompt(7, 2)), Seq(2, _prompt(45, 3))
    hit = Seq(3, a.tokens[:SHARED] + _prompt(6, 4), cached=SHARED)
    logits: list[torch.Tensor] = []
    _step(runner, [(a, 20), (b, 7)], logits)  # two prompts: 27 tokens, compiled
    _step(runner, [(c, 45)], logits)  # 45 tokens: past MAX_BS, eager in both runners
    for _ in range(3):
        _step(runner, [(a, 1), (b, 1), (c, 1)], logits)
    _step(runner, [(a, 1), (b, 1), (c, 1), (hit, 6)], logits)  # mixed, after a cached prefix
    for work in [[a, b, c, hit]] * 4 + [[a, c, hit]] * 2 + [[a]] * 3:
        _step(runner, [(s, 1) for s in work], logits)
    return [s.generated for s in (a, b, c, hit)], logits


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return tiny_model_dir("llama", num_hidden_layers=3)


@pytest.fixture(scope="module")
def eager_run(model_dir):
    return _workload(_runner(model_dir, compiled=False))


@pytest.fixture(scope="module")
def compiled_runner(model_dir):
    torch._dynamo.reset()
    runner = _runner(model_dir, compiled=True)
    assert runner.compiled is not None
    return runner


def test_compiled_tokens_and_logits_match_eager(eager_run, compiled_runner):
    graphs_after_warmup = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    tokens, logits = _workload(compiled_runner)
    eager_tokens, eager_logits = eager_run
    assert tokens == eager_tokens
    assert all(len(t) > 5 for t in tokens)
    for step, (got, want) in enumerate(zip(logits, eager_logits, strict=True)):
        assert torch.allclose(got, want, atol=ATOL, rtol=0), f"step {step}"
    # Every size above (1, 4, 9, 27 tokens...) ran on the warm-up's graphs.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs_after_warmup


def test_compiled_path_is_taken(compiled_runner):
    calls = []
    compiled = compiled_runner.compiled
    assert compiled is not None
    original = compiled.tail
    compiled.tail = lambda *args: calls.append(1) or original(*args)
    try:
        _step(compiled_runner, [(Seq(4, _prompt(5, 5)), 5)], [])
        assert calls == [1]
        _step(compiled_runner, [(Seq(5, _prompt(MAX_BS + 1, 6)), MAX_BS + 1)], [])
        assert calls == [1]  # past torch_compile_max_bs: eager
    finally:
        compiled.tail = original


class _OtherLayer(DecoderLayer):
    def forward(self, *args, **kwargs):  # a block this module does not know how to split
        return super().forward(*args, **kwargs)


def test_can_compile_only_the_shared_decoder(model_dir):
    model, _ = load_model(model_dir, torch.float32, "cpu")
    assert can_compile(model)
    layer = model.model.layers[1]
    layer.__class__ = _OtherLayer
    assert not can_compile(model)
    layer.__class__ = DecoderLayer
    model.model.layers = torch.nn.ModuleList()
    assert not can_compile(model)
