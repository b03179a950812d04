"""A decode step's attention over every layer of SmolLM2-135M, K/V from memory, not cache.

    python scripts/bench_cpu_decode_layers.py [--batch 64] [--prompt 128] [--generated 64]

Each layer has its own K/V pool, as in the engine, so a step reads --batch x (prompt +
generated) keys per layer from DRAM (the 30 layers' pools are far larger than the caches). The
slots are laid out as the engine's allocator hands them out: each sequence's prompt in one run,
then its generated tokens interleaved with the other sequences' (one slot per sequence per
step). Prints the median milliseconds of one step's 30 paged_attention calls and the GB/s of
K/V read. To compare two builds of the kernels, run it from each checkout in turn.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixrt.native.build import load_native

LAYERS, HQ, HKV, HEAD_DIM = 30, 9, 3, 64  # SmolLM2-135M


def engine_slots(batch: int, prompt: int, generated: int) -> torch.Tensor:
    """kv_indices: sequence b's prompt at b*prompt.., its generated token t at
    batch*prompt + t*batch + b."""
    own = [
        torch.cat(
            [
                torch.arange(b * prompt, (b + 1) * prompt),
                batch * prompt + torch.arange(generated) * batch + b,
            ]
        )
        for b in range(batch)
    ]
    return torch.cat(own)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--generated", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ops = load_native()
    if ops is None:
        raise SystemExit("native CPU kernels unavailable (no compiler/ninja, or disabled)")
    keys = args.prompt + args.generated
    pool = args.batch * keys
    gen = torch.Generator().manual_seed(0)
    kv = [
        (torch.randn(pool, HKV, HEAD_DIM, generator=gen).bfloat16(),
         torch.randn(pool, HKV, HEAD_DIM, generator=gen).bfloat16())
        for _ in range(LAYERS)
    ]  # fmt: skip
    q = torch.randn(args.batch, HQ, HEAD_DIM, generator=gen).bfloat16()
    qo = torch.arange(args.batch + 1)
    kv_indptr = torch.arange(args.batch + 1) * keys
    slots = engine_slots(args.batch, args.prompt, args.generated)
    scale = HEAD_DIM**-0.5

    def step() -> None:
        for k, v in kv:
            ops.paged_attention(q, k, v, qo, kv_indptr, slots, scale, 0, [], [])

    step()
    times = []
    deadline = time.perf_counter() + args.seconds
    while len(times) < 5 or time.perf_counter() < deadline:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1e3
    read = LAYERS * 2 * pool * HKV * HEAD_DIM * 2  # K and V, bfloat16
    print(
        f"batch {args.batch} x {keys} keys, {LAYERS} layers, {args.threads} threads: "
        f"{ms:.2f} ms a step, {read / ms / 1e6:.1f} GB/s of K/V ({len(times)} steps)"
    )


if __name__ == "__main__":
    main()
