"""The decoder's layers as one native call (radixrt/models/native_stack.py): over a mixed
workload (prefills of several lengths, one past the dense-matmul threshold, mixed prefill +
decode steps, a prefix-cache hit, decode batches of varying size, extends and decodes behind a
shared-prefix cascade) it gives the modules' logits and KV pool bit for bit, dense and
GGUF-packed, in float32 and bfloat16, with biases (Qwen2); and it steps aside for a model it
does not know."""

from __future__ import annotations

import pytest
import torch
from runner_steps import SHARED, Seq, cpu_runner, feed, prompt

from radixrt.executor.model_runner import ModelRunner
from radixrt.layers.decoder import DecoderLayer
from radixrt.layers.quantized import can_keep_dense
from radixrt.loader.load import load_model
from radixrt.native.build import load_native

pytestmark = pytest.mark.skipif(load_native() is None, reason="native CPU kernels not built")
needs_dense_copy = pytest.mark.skipif(
    not can_keep_dense(), reason="dense copies need oneDNN and a bf16 CPU"
)


def _runner(
    model_dir: str,
    dtype: torch.dtype,
    quantization: str,
    native: bool,
    copy_gb: float = 0,
    copy_dtype: str = "bfloat16",
) -> ModelRunner:
    # Copies serve only steps that int8 activations leave: wide ones, under a row threshold.
    model, cfg = load_model(
        model_dir, dtype, "cpu", quantization=quantization, dense_copy_gb=copy_gb,
        dense_copy_dtype=copy_dtype, int8_rows=31 if copy_gb else None,
    )  # fmt: skip
    model.model.use_native_stack = native
    return cpu_runner(model, cfg)


def _workload(runner: ModelRunner) -> list[torch.Tensor]:
    a, b, c = Seq(0, prompt(20, 1)), Seq(1, prompt(7, 2)), Seq(2, prompt(45, 3))
    hit = Seq(3, a.tokens[:SHARED] + prompt(6, 4), cached=SHARED)
    logits = [feed(runner, [(a, 20), (b, 7)]), feed(runner, [(c, 45)])]
    for _ in range(3):
        logits.append(feed(runner, [(a, 1), (b, 1), (c, 1)]))
    logits.append(feed(runner, [(a, 1), (b, 1), (c, 1), (hit, 6)]))
    for work in [[a, b, c]] * 3 + [[a]] * 3:
        logits.append(feed(runner, [(s, 1) for s in work]))
    return logits


class _Counted:
    """A runner's layer stack that counts the steps it runs."""

    def __init__(self, runner: ModelRunner) -> None:
        self.stack = runner.model.model.native_stack()
        assert self.stack is not None
        self.calls = 0
        self.cascades: list[int] = []  # per step taken: its shared prefixes
        runner.model.model._native_stack = self

    def can_run(self, *args):
        return self.stack.can_run(*args)

    def __call__(self, *args):
        self.calls += 1
        self.cascades.append(
            len(args[3].attn_metadata.native.cascades)
        )  # (hidden, rope, sliding rope, batch)
        return self.stack(*args)


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def model_dir(request, tiny_model_dir) -> str:
    # hidden 64, 4 query heads over 2 KV heads: GQA, and every width a multiple of 32. Gemma 3
    # (native_sandwich.py): a window of 7 in layers 0 and 2, so most steps pass it. Qwen2:
    # biases on q/k/v, added by the op as the modules add them.
    if request.param == "gemma3":
        return tiny_model_dir("gemma3")
    return tiny_model_dir(request.param, num_hidden_layers=3)


@pytest.mark.parametrize(
    ("dtype", "quantization"),
    [
        (torch.float32, "none"),
        (torch.float32, "int4"),
        (torch.float32, "int8"),
        (torch.bfloat16, "none"),
        (torch.bfloat16, "int4"),  # the prefill of 45 multiplies bf16-rounded weight tiles
        pytest.param(torch.bfloat16, "int4+copy", marks=needs_dense_copy),  # ... oneDNN's copy
        pytest.param(torch.bfloat16, "int4+int8copy", marks=needs_dense_copy),  # ... W8A8
    ],
)
def test_stack_equals_the_modules_bit_for_bit(model_dir, dtype, quantization):
    quantization, _, copy = quantization.partition("+")
    copy_gb = 1.0 if copy else 0.0
    copy_dtype = "int8" if copy == "int8copy" else "bfloat16"
    modules = _runner(model_dir, dtype, quantization, False, copy_gb, copy_dtype)
    stack = _runner(model_dir, dtype, quantization, True, copy_gb, copy_dtype)
    if copy:
        copies = stack.model.model.native_stack()
        int8 = copies.dense_copies[0].dtype == torch.int8
        assert copies.dense_copies[0].is_mkldnn != int8 and (copy_dtype == "int8") == int8
    counted = _Counted(stack)
    want, got = _workload(modules), _workload(stack)
    assert counted.calls == len(got)  # every step took the op
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"step {step}"
    for layer in range(len(modules.kv_pool.k_buffer)):
        assert torch.equal(stack.kv_pool.k_buffer[layer], modules.kv_pool.k_buffer[layer])
        assert torch.equal(stack.kv_pool.v_buffer[layer], modules.kv_pool.v_buffer[layer])


def _cascade_workload(runner: ModelRunner) -> list[torch.Tensor]:
    prefix = prompt(300, 9)  # a cascade takes whole chunks of 256 keys
    seqs = [Seq(r, prefix + prompt(3, r)) for r in range(4)]
    for r in (1, 2, 3):  # rows 1-3 share row 0's slots for the prefix, as a cache hit would
        runner.table.write(r, 0, torch.arange(len(prefix)))
    logits = [feed(runner, [(seqs[0], 303)])]
    for s in seqs[1:]:
        s.cached = len(prefix)
    logits.append(feed(runner, [(s, 3) for s in seqs[1:]]))  # extends after the shared prefix
    for _ in range(3):  # decodes of rows 1-3: their prefix is a cascade
        logits.append(feed(runner, [(s, 1) for s in seqs[1:]]))
    return logits


@pytest.mark.parametrize(
    ("dtype", "quantization"), [(torch.float32, "int4"), (torch.bfloat16, "int4")]
)
def test_a_shared_prefix_cascade_takes_the_op_bit_for_bit(model_dir, dtype, quantization):
    modules = _runner(model_dir, dtype, quantization, native=False)
    stack = _runner(model_dir, dtype, quantization, native=True)
    counted = _Counted(stack)
    want, got = _cascade_workload(modules), _cascade_workload(stack)
    assert counted.calls == len(got)
    assert counted.cascades == [0, 1, 1, 1, 1]  # the extends' and the decodes' shared prefix
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"step {step}"


class _OtherLayer(DecoderLayer):
    def forward(self, *args, **kwargs):  # a block the op does not know
        return super().forward(*args, **kwargs)


def test_only_plain_layers_take_the_op(model_dir, tiny_model_dir):
    model, _ = load_model(model_dir, torch.float32, "cpu")
    model.model.layers[1].__class__ = _OtherLayer
    assert model.model.native_stack() is None
    qwen3, _ = load_model(tiny_model_dir("qwen3", num_hidden_layers=2), torch.float32, "cpu")
    assert qwen3.model.native_stack() is None  # q/k norms between the ops
