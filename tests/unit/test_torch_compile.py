"""--enable-torch-compile on the CPU: the compiled forward gives eager's greedy tokens, token for
token, and logits within float32 rounding, over a mixed workload (prefills of several lengths,
a mixed prefill + decode step, a prefix-cache hit, decode batches of varying size); and it
does so from the graphs built at warm-up, without recompiling per size."""

from __future__ import annotations

import pytest
import torch
from runner_steps import SHARED, Seq, cpu_runner, feed, prompt

from radixrt.executor.compiled_forward import can_compile
from radixrt.executor.model_runner import ModelRunner
from radixrt.layers.decoder import DecoderLayer
from radixrt.loader.load import load_model

pytestmark = pytest.mark.slow  # torch.compile takes seconds

MAX_BS = 32  # steps of up to this many new tokens run compiled
# Same weights, same float32 math, but inductor fuses and reorders the reductions (norm
# statistics): logits agree to float32 rounding accumulated over the layers.
ATOL = 1e-4


def _runner(model_dir: str, compiled: bool) -> ModelRunner:
    model, cfg = load_model(model_dir, torch.float32, "cpu")
    return cpu_runner(model, cfg, enable_torch_compile=compiled, torch_compile_max_bs=MAX_BS)


def _workload(runner: ModelRunner) -> tuple[list[list[int]], list[torch.Tensor]]:
    a, b, c = Seq(0, prompt(20, 1)), Seq(1, prompt(7, 2)), Seq(2, prompt(45, 3))
    hit = Seq(3, a.tokens[:SHARED] + prompt(6, 4), cached=SHARED)
    logits: list[torch.Tensor] = []
    logits.append(feed(runner, [(a, 20), (b, 7)]))  # two prompts: 27 tokens, compiled
    logits.append(feed(runner, [(c, 45)]))  # 45 tokens: past MAX_BS, eager in both runners
    for _ in range(3):
        logits.append(feed(runner, [(a, 1), (b, 1), (c, 1)]))
    logits.append(feed(runner, [(a, 1), (b, 1), (c, 1), (hit, 6)]))  # mixed, after a prefix hit
    for work in [[a, b, c, hit]] * 4 + [[a, c, hit]] * 2 + [[a]] * 3:
        logits.append(feed(runner, [(s, 1) for s in work]))
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
        feed(compiled_runner, [(Seq(4, prompt(5, 5)), 5)])
        assert calls == [1]
        feed(compiled_runner, [(Seq(5, prompt(MAX_BS + 1, 6)), MAX_BS + 1)])
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
