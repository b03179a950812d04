"""The engine on a GPU: greedy tokens against the CPU's, and CUDA-graph decode steps timed.

    python scripts/gpu_engine_check.py --write-cpu-reference ref.json   # here, on the CPU
    python scripts/gpu_engine_check.py --cpu-reference ref.json --out DIR   # on the GPU

1. Greedy tokens, float32, the default model (or --model-path): a ragged batch (one prompt of
   ~700 tokens, so the extend kernel runs many key blocks), then one prompt again (a radix-cache
   hit, its prefix read from the pool). Run as: triton + CUDA graphs; triton + graphs with
   chunked prefill (chunks of 64, pages of 16: prefill chunks and decode steps share batches);
   torch backend, eager. Each must equal the CPU's float32 tokens, which --write-cpu-reference
   computes (with the prompts' token ids, so both sides feed the same ids).
2. Decode steps, bfloat16: ModelRunner.forward of one decode step (the model and the LM head)
   at several batch sizes, replayed from a CUDA graph and run eagerly, timed with CUDA events.

Writes gpu_engine.md and gpu_engine.json into --out (default: $OUT, else the current folder).
Exit status 1 when any token check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import radixrt
from radixrt.attention.forward_batch import SimpleStep
from radixrt.attention.triton_backend import TritonAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.executor.model_runner import ModelRunner
from radixrt.loader.default_model import default_model_path
from radixrt.loader.load import load_model

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Here is a list of fruits: apples, pears, plums. Name one more:",
    "Write a haiku about the sea.",
]
LONG_TEXT = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(50))
MAX_NEW = 32
# (label, engine settings) for the greedy check on the GPU.
GPU_RUNS = [
    ("triton, CUDA graphs", dict(attention_backend="triton")),
    (
        "triton, CUDA graphs, chunked prefill 64, page 16",
        dict(attention_backend="triton", chunked_prefill_size=64, page_size=16),
    ),
    ("torch, eager", dict(attention_backend="torch", disable_cuda_graph=True)),
]
STEP_BATCHES = [1, 8, 64]
PROMPT_LEN = 128  # each sequence's keys when its decode step is timed


def greedy(model_path: str, device: str, ids: list[list[int]] | None, **settings) -> dict:
    """Tokens of the batch, then of its last prompt again (cached); the prompts' ids."""
    params = {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
    with radixrt.Engine(
        model_path=model_path,
        dtype="float32",
        device=device,
        in_process=True,
        max_total_tokens=8192,
        **settings,
    ) as engine:
        if ids is None:
            ids = [engine.tokenizer.encode(t) for t in [*TEXTS, LONG_TEXT]]
        outs = engine.generate(input_ids=ids, sampling_params=params)
        again = engine.generate(input_ids=ids[-1], sampling_params=params)
        cached = again["meta_info"]["cached_tokens"]
    return {"ids": ids, "tokens": [o["output_ids"] for o in outs] + [again["output_ids"]],
            "cached": cached}  # fmt: skip


def first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            pairs = zip(x, y, strict=False)
            at = next((j for j, (p, q) in enumerate(pairs) if p != q), min(len(x), len(y)))
            return f"prompt {i}, token {at}"
    return "-"


def check_tokens(model_path: str, reference: dict) -> tuple[list[list[str]], bool]:
    rows, ok = [], True
    for label, settings in GPU_RUNS:
        got = greedy(model_path, "cuda", reference["ids"], **settings)
        same = got["tokens"] == reference["tokens"]
        ok &= same
        rows.append(
            [
                label,
                "PASS" if same else "FAIL",
                first_difference(got["tokens"], reference["tokens"]),
                str(got["cached"]),
            ]
        )
    return rows, ok


def step_runner(model, cfg, batch: int, graphs: bool) -> tuple[ModelRunner, SimpleStep]:
    """A runner whose table rows hold `batch` prefilled prompts; their next decode step."""
    slots = PROMPT_LEN + 16
    pool = KVPool(batch * slots, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.dtype, "cuda")
    table = ReqToTokenTable(batch, slots, "cuda")
    for row in range(batch):
        table.write(row, 0, torch.arange(row * slots, (row + 1) * slots))
    runner = ModelRunner(
        model,
        pool,
        TritonAttentionBackend(device="cuda"),
        table,
        "cuda",
        disable_cuda_graph=not graphs,
        cuda_graph_max_bs=max(STEP_BATCHES),
    )
    rows = list(range(batch))
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, 1000, (batch * PROMPT_LEN,), generator=gen).tolist()
    ends = [(r + 1) * PROMPT_LEN - 1 for r in rows]
    runner.forward(SimpleStep(rows, [0] * batch, [PROMPT_LEN] * batch, ids, ends))
    return runner, SimpleStep(rows, [PROMPT_LEN] * batch, [1] * batch, [7] * batch, rows)


def time_step(runner: ModelRunner, step: SimpleStep, reps: int = 50) -> float:
    """Milliseconds per decode step (mean of `reps` after warm-up), input copies included."""
    for _ in range(5):
        runner.forward(step)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        runner.forward(step)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def time_steps(model_path: str) -> list[list[str]]:
    model, cfg = load_model(model_path, torch.bfloat16, "cuda")
    rows = []
    for batch in STEP_BATCHES:
        ms = {}
        for graphs in (True, False):
            runner, step = step_runner(model, cfg, batch, graphs)
            ms[graphs] = time_step(runner, step)
            del runner
        rows.append(
            [
                str(batch),
                f"{ms[True]:.3f}",
                f"{ms[False]:.3f}",
                f"{ms[False] / ms[True]:.2f}x",
                f"{batch / ms[True] * 1e3:.0f}",
            ]
        )
    return rows


def markdown(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=None, help="default: the default model's .gguf")
    p.add_argument("--write-cpu-reference", metavar="FILE", help="CPU float32 tokens into FILE")
    p.add_argument("--cpu-reference", metavar="FILE", help="compare the GPU's tokens to FILE's")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    model_path = args.model_path or default_model_path()
    if args.write_cpu_reference:
        ref = greedy(model_path, "cpu", None)
        with open(args.write_cpu_reference, "w") as f:
            json.dump({"model": os.path.basename(model_path), **ref}, f)
        print(f"wrote {args.write_cpu_reference}: {len(ref['tokens'])} sequences")
        return 0
    if not args.cpu_reference or not torch.cuda.is_available():
        p.error("on a GPU, give --cpu-reference (made here with --write-cpu-reference)")
    with open(args.cpu_reference) as f:
        reference = json.load(f)
    t0 = time.perf_counter()
    token_rows, ok = check_tokens(model_path, reference)
    step_rows = time_steps(model_path)
    gpu = torch.cuda.get_device_name(0)
    text = "\n\n".join(
        [
            markdown(
                f"Greedy tokens on {gpu}, float32, {MAX_NEW} new tokens x {len(TEXTS) + 2} "
                f"sequences, against the CPU's float32 tokens ({reference['model']})",
                ["GPU run", "equal to the CPU", "first difference", "cached tokens on repeat"],
                token_rows,
            ),
            markdown(
                f"Decode step (model + LM head), bfloat16, {PROMPT_LEN} keys per sequence, "
                "CUDA events, mean of 50",
                ["batch", "CUDA graph ms", "eager ms", "graph speed-up", "graph tok/s"],
                step_rows,
            ),
            f"torch {torch.__version__}, {time.perf_counter() - t0:.0f} s",
        ]
    )
    print(text)
    with open(os.path.join(args.out, "gpu_engine.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "gpu_engine.json"), "w") as f:
        json.dump({"tokens": token_rows, "steps": step_rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
