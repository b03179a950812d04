"""Where one forward step's time goes: torch profiler tables for a batch-1 decode step and a
2,000-token prefill on the default model (docs/benchmarks.md's profile). With --compile: the
torch.compile warm-up time and decode steps at batch 1 and 32, eager against compiled in the
same process (interleaved, best of 5), and the host side of a batch-64 decode step
(ModelRunner.build_batch + the attention metadata), in microseconds.

    python scripts/profile_step.py [--dtype bfloat16] [--quantization auto] [--rows 8] [--compile]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import profile

from radixrt.attention.forward_batch import SimpleStep
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.executor.model_runner import ModelRunner
from radixrt.loader.default_model import default_model_path
from radixrt.loader.load import load_model


def time_step(runner: ModelRunner, step: SimpleStep, repeats: int) -> float:
    runner.forward(step)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        runner.forward(step)
    return (time.perf_counter() - start) / repeats


def decode_batch(bs: int, context: int = 60) -> SimpleStep:
    """Decode rows 0..bs-1, each with `context` tokens (row r's slots: r*128 ..)."""
    return SimpleStep(list(range(bs)), [context - 1] * bs, [1] * bs, [5] * bs, list(range(bs)))


def best_of(fn: Callable[[], object], rounds: int = 5, repeats: int = 4) -> float:
    """Best mean seconds of `repeats` calls over `rounds` (the machine is shared)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        times.append((time.perf_counter() - start) / repeats)
    return min(times)


def compare_compile(model: torch.nn.Module, cfg: Any, dtype: torch.dtype) -> None:
    pool = KVPool(64 * 128, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
    table = ReqToTokenTable(64, 128, "cpu")
    for row in range(64):
        table.write(row, 0, torch.arange(row * 128, (row + 1) * 128))
    backend = TorchAttentionBackend()
    eager = ModelRunner(model, pool, backend, table, "cpu")  # type: ignore[arg-type]
    start = time.perf_counter()
    compiled = ModelRunner(model, pool, backend, table, "cpu", enable_torch_compile=True)  # type: ignore[arg-type]
    print(f"\n## torch.compile warm-up: {time.perf_counter() - start:.1f} s")
    for bs in (1, 32):
        step = decode_batch(bs)
        e, c = (best_of(lambda r=r, s=step: r.forward(s)) for r in (eager, compiled))
        print(f"decode batch {bs}: eager {e * 1e3:.1f} ms, compiled {c * 1e3:.1f} ms, x{e / c:.2f}")
    step = decode_batch(64)

    def host() -> None:
        fb = eager.build_batch(step)
        backend.init_forward_metadata(fb)

    with torch.inference_mode():
        print(f"host side of a batch-64 decode step: {best_of(host, repeats=20) * 1e6:.0f} us")
        with profile() as prof:
            host()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


def one_sequence(prefix: int, new: int) -> SimpleStep:
    """A step of one sequence in table row 0 (its slots: positions 0.. in slots 0..)."""
    return SimpleStep([0], [prefix], [new], [5] * new, [new - 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--model-path", default=None, help="a GGUF file (default model if unset)")
    parser.add_argument("--rows", type=int, default=8, help="operators listed per table")
    parser.add_argument("--compile", action="store_true", help="eager vs torch.compile")
    parser.add_argument("--quantization", default="auto", choices=["auto", "none", "int8", "int4"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    path = args.model_path or default_model_path()
    model, cfg = load_model(path, dtype, "cpu", quantization=args.quantization)
    if args.compile:
        compare_compile(model, cfg, dtype)
        return
    pool = KVPool(4096, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
    table = ReqToTokenTable(1, 4096, "cpu")
    table.write(0, 0, torch.arange(4096))
    runner = ModelRunner(model, pool, TorchAttentionBackend(), table, "cpu")
    cases = {
        "decode, batch 1, context 60": (one_sequence(59, 1), 20),
        "prefill, 2000 tokens": (one_sequence(0, 2000), 3),
    }
    for name, (step, repeats) in cases.items():
        seconds = time_step(runner, step, repeats)
        tokens = sum(step.extend_lens)
        print(
            f"\n## {name}: {seconds * 1000:.1f} ms per step "
            f"({tokens / seconds if tokens > 1 else 1 / seconds:.0f} tok/s)"
        )
        with profile() as prof:
            runner.forward(step)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
