"""Where one forward step's time goes: torch profiler tables for a batch-1 decode step and a
2,000-token prefill on the default model (the README's profile).

    python scripts/profile_step.py [--dtype bfloat16] [--rows 8]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import profile

from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.executor.forward_batch import SimpleStep
from radixrt.executor.model_runner import ModelRunner
from radixrt.loader.default_model import default_model_path
from radixrt.loader.load import load_model


def time_step(runner: ModelRunner, step: SimpleStep, repeats: int) -> float:
    runner.forward(step)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        runner.forward(step)
    return (time.perf_counter() - start) / repeats


def one_sequence(prefix: int, new: int) -> SimpleStep:
    """A step of one sequence in table row 0 (its slots: positions 0.. in slots 0..)."""
    return SimpleStep([0], [prefix], [new], [5] * new, [new - 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, default=8, help="operators listed per table")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    model, cfg = load_model(default_model_path(), dtype, "cpu")
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
