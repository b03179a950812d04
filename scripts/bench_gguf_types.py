"""Every GGUF block type's matmul on this CPU: the int8 kernel (llama.cpp's way; the default for
steps below 32 rows under bfloat16) against the float paths, per batch rows
(docs/quantization.md's type table).

    python scripts/bench_gguf_types.py [--rows 1,4,8,64] [--threads 2] [--repeats 5]
                                       [--types Q4_K,Q6_K,...]

One step's matmuls of a 0.25B model's shapes (hidden 1024, 16 layers: q/k/v 1536 x 1024,
o 1024 x 1024, gate/up 5632 x 1024, down 1024 x 2816), random blocks of each type (scales of a
realistic size, so no subnormal arithmetic), in microseconds per step and the weight bytes
read per second; the best of --repeats, kernels interleaved. The int8 column runs int8 at
every row count (--cpu-gguf-int8-rows -1); the float one, from `DENSE_FROM_ROWS` rows on, the
expanded tiles (float32 here: x is float32).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from radixrt.layers.gguf_blocks import BLOCK_TYPES
from radixrt.layers.quantized import INT8_EVERY_STEP, GGUFWeight
from radixrt.native.build import load_native
from radixrt.native.cpu import cpu_flags, forced_isa

SHAPES = [(1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816)] * 16
# Byte offsets of each type's fp16 scale fields within a block (gguf_types.h's layouts).
HALVES = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_XS": [0],
}  # fmt: skip


def random_weight(name: str, n: int, k: int, rng: np.random.Generator) -> GGUFWeight:
    t = BLOCK_TYPES[name]
    blocks = rng.integers(0, 256, size=(n, k // t.weights, t.bytes), dtype=np.uint8)
    for offset in HALVES[name]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return GGUFWeight(torch.from_numpy(blocks.reshape(n, -1).copy()), name, k)


def step_us(weights: list[GGUFWeight], rows: int, int8_rows: int, repeats: int) -> float:
    for w in weights:
        w.int8_rows = int8_rows
    inputs = {k: torch.randn(rows, k) for k in {w.in_features for w in weights}}
    best = float("inf")
    with torch.inference_mode():
        for repeat in range(repeats + 1):  # the first warms up
            start = time.perf_counter()
            for w in weights:
                w(inputs[w.in_features])
            if repeat:
                best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,4,8,64")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--types", default=",".join(BLOCK_TYPES))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if load_native() is None:
        raise SystemExit("radixrt's native CPU ops did not build; see docs/cpu_kernels.md")
    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile"})
    print(f"{args.threads} threads; CPU flags {' '.join(flags)}; kernels: {forced_isa()} paths")
    rows = [int(r) for r in args.rows.split(",")]
    header = " | ".join(f"{m} rows int8 | {m} rows float" for m in rows)
    print(f"\n| type | bits/weight | {header} |\n|---|---|" + "---|---|" * len(rows))
    rng = np.random.default_rng(0)
    for name in args.types.split(","):
        t = BLOCK_TYPES[name]
        weights = [random_weight(name, n, k, rng) for n, k in SHAPES]
        size = sum(w.packed.numel() for w in weights)
        cells = []
        for m in rows:
            for int8_rows in (INT8_EVERY_STEP, 0):
                us = step_us(weights, m, int8_rows, args.repeats)
                cells.append(f"{us / 1000:.2f} ms ({size / us / 1e3:.1f} GB/s)")
        bits = 8 * t.bytes / t.weights
        print(f"| {name} | {bits:.2f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
