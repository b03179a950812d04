"""One model-runner step on the default model, per --quantization setting: batch-1 decode,
batch-64 decode and a 1,000-token prefill, in milliseconds (docs/cpu_kernels.md).

    python scripts/bench_cpu_step.py [--quantization auto,none] [--dtype float32] [--threads 2]
                                     [--compile] [--dense-copy-gb 0,1]
                                     [--dense-copy-dtype bfloat16,int8] [--rounds 1]
                                     [--copy-from-rows 12,32]
                                     [--positions 1,2,4,8,12 --context 800]

Each setting's runner is built once; with --rounds N every setting is timed N times, in turn.
--copy-from-rows sets COPY_FROM_ROWS (radixrt/layers/quantized.py) per setting: from how many
rows a step multiplies the dense copies instead of the blocks (the batch-16 decode shows it).

--positions times, instead, one request's step of k query positions after --context cached
keys for each k: what a speculative verification of k - 1 drafts costs against a decode (k = 1).

Run it under other OpenMP settings (GOMP_SPINCOUNT=0 ...) or beside a busy process to see how
a step degrades under contention. The model load is not timed.
"""

from __future__ import annotations

import argparse
import time

import torch

from radixrt.attention.forward_batch import SimpleStep
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.executor.model_runner import ModelRunner
from radixrt.layers import quantized
from radixrt.loader.default_model import default_model_path
from radixrt.loader.load import load_model
from radixrt.models import native_stack

ROWS, ROW_LEN = 64, 1024  # table rows (requests) and their slots


def make_runner(
    quantization: str,
    compile_: bool,
    dtype: torch.dtype = torch.float32,
    dense_copy_gb: float = 0,
    dense_copy_dtype: str = "bfloat16",
    model_path: str | None = None,
) -> ModelRunner:
    model, cfg = load_model(
        model_path or default_model_path(), dtype, "cpu", quantization=quantization,
        dense_copy_gb=dense_copy_gb, dense_copy_dtype=dense_copy_dtype,
    )  # fmt: skip
    pool = KVPool(ROWS * ROW_LEN, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
    table = ReqToTokenTable(ROWS, ROW_LEN, "cpu")
    for r in range(ROWS):
        table.write(r, 0, torch.arange(r * ROW_LEN, (r + 1) * ROW_LEN))
    return ModelRunner(
        model, pool, TorchAttentionBackend(), table, "cpu",
        enable_torch_compile=compile_, torch_compile_max_bs=ROWS,
    )  # fmt: skip


def ms(runner: ModelRunner, step: SimpleStep, repeats: int) -> float:
    runner.forward(step)
    start = time.perf_counter()
    for _ in range(repeats):
        runner.forward(step)
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quantization", default="auto,none")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="--enable-torch-compile")
    p.add_argument(
        "--dense-copy-gb", default="0", help="--cpu-dense-copy-gb values, comma-separated"
    )
    p.add_argument("--dense-copy-dtype", default="bfloat16", help="comma-separated")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--copy-from-rows", default=str(quantized.COPY_FROM_ROWS), help="comma-separated"
    )
    p.add_argument("--positions", help="comma-separated k: one request's k-position steps")
    p.add_argument("--context", type=int, default=800, help="cached keys before --positions")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    decode_1 = SimpleStep([0], [100], [1], [5], [0])
    rows = list(range(ROWS))
    decode_64 = SimpleStep(rows, [200] * ROWS, [1] * ROWS, [5] * ROWS, rows)
    decode_16 = SimpleStep(rows[:16], [200] * 16, [1] * 16, [5] * 16, rows[:16])
    prefill = SimpleStep([0], [0], [1000], [7] * 1000, [999])
    settings = [
        (q, float(g), c, int(r))
        for q in args.quantization.split(",")
        for g in args.dense_copy_gb.split(",")
        for c in args.dense_copy_dtype.split(",")
        for r in args.copy_from_rows.split(",")
    ]
    runners = [
        make_runner(q, args.compile, getattr(torch, args.dtype), g, c) for q, g, c, _ in settings
    ]
    if args.positions:
        time_positions(runners, settings, args)
        return
    for _ in range(args.rounds):
        for (q, gb, copy_dtype, copy_from), runner in zip(settings, runners, strict=True):
            quantized.COPY_FROM_ROWS = native_stack.COPY_FROM_ROWS = copy_from
            print(
                f"quantization={q} dtype={args.dtype} dense_copy_gb={gb} copies={copy_dtype} "
                f"copy_from_rows={copy_from} threads={args.threads} compile={args.compile}: "
                f"decode bs1 {ms(runner, decode_1, 30):.1f} ms, "
                f"bs16 {ms(runner, decode_16, 10):.1f} ms, "
                f"bs64 {ms(runner, decode_64, 5):.1f} ms, "
                f"prefill 1000 {ms(runner, prefill, 2):.0f} ms",
                flush=True,
            )


def time_positions(runners: list[ModelRunner], settings: list, args: argparse.Namespace) -> None:
    """Per setting, ms of one request's step of k positions after args.context keys."""
    ks = [int(k) for k in args.positions.split(",")]
    for _ in range(args.rounds):
        for setting, runner in zip(settings, runners, strict=True):
            times = [
                ms(runner, SimpleStep([0], [args.context], [k], [5] * k, list(range(k))), 20)
                for k in ks
            ]
            cells = ", ".join(f"{k}: {t:.1f}" for k, t in zip(ks, times, strict=True))
            print(f"{setting} dtype={args.dtype} context={args.context}: {cells} ms", flush=True)


if __name__ == "__main__":
    main()
