"""Every GGUF block type's matmul on this CPU: the int8 kernel (llama.cpp's way; the default for
steps below 32 rows under bfloat16) against the float paths, per batch rows
(docs/quantization.md's type table).

    python scripts/bench_gguf_types.py [--rows 1,4,8,64] [--threads 2] [--repeats 5]
                                       [--types Q4_K,Q6_K,...] [--tiles] [--copies]

One step's matmuls of a 0.25B model's shapes (hidden 1024, 16 layers: q/k/v 1536 x 1024,
o 1024 x 1024, gate/up 5632 x 1024, down 1024 x 2816), random blocks of each type (scales of a
realistic size, so no subnormal arithmetic), in microseconds per step and the weight bytes
read per second; the best of --repeats, kernels interleaved. The int8 column runs int8 at
every row count (--cpu-gguf-int8-rows -1); the float one, from `DENSE_FROM_ROWS` rows on, the
expanded tiles (float32 here: x is float32). --tiles adds the int8 kernel on the tiles the
loader adds to TILED_TYPES weights (native/csrc/gguf_tiles.cpp, gguf_ktiles.cpp), against the
int8 kernel on the blocks; --copies the bfloat16 dense copies (oneDNN, bfloat16 x) that steps
of COPY_FROM_ROWS rows or more (TILED_COPY_FROM_ROWS with tiles) multiply instead. The kinds
take turns within each repeat.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from radixrt.layers.gguf_blocks import BLOCK_TYPES
from radixrt.layers.quantized import INT8_EVERY_STEP, TILED_TYPES, GGUFWeight
from radixrt.native.build import load_native
from radixrt.native.cpu import cpu_flags, forced_isa

SHAPES = [(1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816)] * 16
# Byte offsets of each type's fp16 scale fields within a block (gguf_types.h's layouts).
HALVES = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_XS": [0],
}  # fmt: skip


def random_blocks(name: str, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    t = BLOCK_TYPES[name]
    blocks = rng.integers(0, 256, size=(n, k // t.weights, t.bytes), dtype=np.uint8)
    for offset in HALVES[name]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return torch.from_numpy(blocks.reshape(n, -1).copy())


def step_us(kinds: list[list[GGUFWeight]], rows: int, repeats: int) -> list[float]:
    """Each kind's best step time in microseconds, the kinds taking turns within a repeat."""
    inputs = {w.in_features: torch.randn(rows, w.in_features) for w in kinds[0]}
    bf16 = {k: x.bfloat16() for k, x in inputs.items()}
    best = [float("inf")] * len(kinds)
    with torch.inference_mode():
        for repeat in range(repeats + 1):  # the first warms up
            for i, weights in enumerate(kinds):
                x = bf16 if weights[0].dense is not None else inputs
                start = time.perf_counter()
                for w in weights:
                    w(x[w.in_features])
                if repeat:
                    best[i] = min(best[i], time.perf_counter() - start)
    return [b * 1e6 for b in best]


def step_kinds(name: str, rng: np.random.Generator, columns: list[str]) -> list[list[GGUFWeight]]:
    """One step's weights for each of the columns (int8, float, int8 tiles, bf16 copy)."""
    blocks = [(random_blocks(name, n, k, rng), k) for n, k in SHAPES]
    kinds = []
    for column in columns:
        weights = [GGUFWeight(b, name, k) for b, k in blocks]
        for w in weights:
            w.int8_rows = 0 if column == "float" else INT8_EVERY_STEP
            if column == "int8 tiles":
                w.keep_tiles()
            if column == "bf16 copy":
                w.keep_dense("bfloat16")
                w.copy_from_rows = 1
        kinds.append(weights)
    return kinds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,4,8,64")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--types", default=",".join(BLOCK_TYPES))
    p.add_argument("--tiles", action="store_true", help="add int8 on tiles (TILED_TYPES only)")
    p.add_argument("--copies", action="store_true", help="add the bf16 dense copies")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if load_native() is None:
        raise SystemExit("radixrt's native CPU ops did not build; see docs/cpu_kernels.md")
    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile"})
    print(f"{args.threads} threads; CPU flags {' '.join(flags)}; kernels: {forced_isa()} paths")
    rows = [int(r) for r in args.rows.split(",")]
    columns = ["int8", "float"] + ["int8 tiles"] * args.tiles + ["bf16 copy"] * args.copies
    header = " | ".join(f"{m} rows {c}" for m in rows for c in columns)
    print(f"\n| type | bits/weight | {header} |\n|---|---|" + "---|" * len(rows) * len(columns))
    rng = np.random.default_rng(0)
    for name in args.types.split(","):
        if args.tiles and name not in TILED_TYPES:
            raise SystemExit(f"--tiles: {name} has no tiles; choose from {TILED_TYPES}")
        t = BLOCK_TYPES[name]
        kinds = step_kinds(name, rng, columns)
        size = sum(w.packed.numel() for w in kinds[0])
        cells = []
        for m in rows:
            for us in step_us(kinds, m, args.repeats):
                cells.append(f"{us / 1000:.2f} ms ({size / us / 1e3:.1f} GB/s)")
        bits = 8 * t.bytes / t.weights
        print(f"| {name} | {bits:.2f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
