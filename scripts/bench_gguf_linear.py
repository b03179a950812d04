"""The default model's linear layers at one step, per kernel and batch rows: which matmul to use
for GGUF-block weights on this CPU (docs/quantization.md's kernel table; layers/quantized.py).

    python scripts/bench_gguf_linear.py [--rows 1,4,16,32,64,256] [--threads 2] [--repeats 3]
                                        [--kinds "bf16 copy,int8 copy (W8A8)"]

Every kernel runs the same 30 layers x 4 projections of SmolLM2-135M's shapes plus the LM head
(random weights, so no layer stays in cache between repeats, as in a real step) and reports
milliseconds per step, the best of --repeats; the kernels take turns within each repeat, so a
machine shared with other jobs slows them alike:
- dense fp32: F.linear on float32 weights (today's `--quantization none` on this CPU);
- gguf blocks: radixrt's native kernel on Q4_1 blocks (Q8_0 for the LM head), read as stored;
- gguf int8 x: the same blocks times x rounded to int8 per block (--cpu-gguf-int8-rows; bf16
  models' default below 32 rows); gguf int8 tiles: the same with the tiles the loader adds
  to Q4_0 / Q4_1 / Q8_0 weights (native/csrc/gguf_tiles.cpp);
- gguf expand + BLAS: the same blocks expanded to float32 per call, then the BLAS matmul
  (what radixrt does from `DENSE_FROM_ROWS` rows on);
- aten int4pack / int8pack: torch's `_weight_int4pack_mm_for_cpu` (group 32) and
  `_weight_int8pack_mm` (per row), bfloat16 activations, as the issue proposed;
- bf16 copy / int8 copy (W8A8): the blocks' copies for wide batches (`--cpu-dense-copy-dtype`),
  oneDNN's bfloat16 matmul and radixrt::w8a8_linear, on bfloat16 activations.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from radixrt.layers.quantized import GGUFWeight, dense_copy_linear, quantize
from radixrt.native.build import load_native

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
LM_HEAD = (49152, 576)


def weights(kind: str) -> list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]]:
    """(in_features, x -> y) for every matmul of one step."""
    shapes = LAYER_SHAPES * 30 + [LM_HEAD]
    out = []
    for i, (n, k) in enumerate(shapes):
        w = torch.randn(n, k) * 0.05
        lm_head = i == len(shapes) - 1
        out.append((k, _kernel(kind, w, lm_head)))
    return out


def _kernel(kind: str, w: torch.Tensor, lm_head: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    n, k = w.shape
    if kind == "dense fp32":
        return lambda x: F.linear(x, w)
    if kind.endswith("copy") or kind.endswith("(W8A8)"):
        copy = GGUFWeight(quantize(w, "int4"), "int4", k)
        copy.keep_dense("bfloat16" if kind == "bf16 copy" else "int8")
        dense, scale = copy.dense, copy.dense_scale
        assert dense is not None
        return lambda x: dense_copy_linear(x, dense, scale)
    if kind.startswith("gguf"):
        fmt = "int8" if lm_head else "int4"
        packed = GGUFWeight(quantize(w, fmt), fmt, k)
        dense_from = 0 if kind == "gguf expand + BLAS" else 1 << 30
        int8_rows = 1 << 30 if "int8" in kind else 0
        if kind == "gguf int8 tiles":
            packed.keep_tiles()
        return lambda x: torch.ops.radixrt.gguf_linear(x, packed.packed, n, dense_from, int8_rows)
    if kind == "aten int4pack":
        codes = torch.randint(0, 16, (n, k), dtype=torch.int32)
        packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        scales = torch.randn(k // 32, n, 2).bfloat16()
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.bfloat16(), packed4, 32, scales
        ).float()
    codes8 = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scale8 = torch.rand(n).bfloat16()
    return lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), codes8, scale8).float()


KINDS = [
    "dense fp32", "gguf blocks", "gguf int8 x", "gguf int8 tiles", "gguf expand + BLAS",
    "aten int4pack", "aten int8pack", "bf16 copy", "int8 copy (W8A8)",
]  # fmt: skip
Matmuls = dict[str, list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]]]


def best_ms_per_step(matmuls: Matmuls, rows: int, repeats: int) -> list[float]:
    """Each kind's best step time in ms, the kinds interleaved within every repeat."""
    kinds = list(matmuls)
    inputs = {k: torch.randn(rows, k) for k in {k for k, _ in matmuls[kinds[0]]}}
    bf16 = {k: x.bfloat16() for k, x in inputs.items()}
    best = dict.fromkeys(kinds, float("inf"))
    for repeat in range(repeats + 1):  # the first round warms up
        for kind in kinds:
            x = bf16 if "copy" in kind else inputs
            start = time.perf_counter()
            for k, f in matmuls[kind]:
                f(x[k])
            if repeat:
                best[kind] = min(best[kind], (time.perf_counter() - start) * 1000)
    return [best[kind] for kind in kinds]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,4,16,32,64,256")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS)
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if load_native() is None:
        raise SystemExit("radixrt's native CPU ops did not build; see docs/cpu_kernels.md")
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - set(KINDS):
        raise SystemExit(f"--kinds: unknown {sorted(unknown)}; choose from {KINDS}")
    rows = [int(r) for r in args.rows.split(",")]
    matmuls = {kind: weights(kind) for kind in kinds}
    print(f"ms per step (30 layers + LM head), {args.threads} threads")
    print("| rows | " + " | ".join(kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for m in rows:
        times = best_ms_per_step(matmuls, m, args.repeats)
        print(f"| {m} | " + " | ".join(f"{t:.1f}" for t in times) + " |", flush=True)


if __name__ == "__main__":
    main()
