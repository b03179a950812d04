"""radixrt's native CPU paged attention against torch SDPA, in the same run, on SmolLM2's shapes.

Three workloads, per dtype: one prefill of --prefill tokens (causal, no prefix), 16 sequences
of 5 new tokens after a --context prefix (short extends), and a batch-64 decode over --context
keys. The native kernel reads its keys from a shuffled pool by slot; SDPA gets the same keys
already gathered (its best case: no gather is timed). Then 64 decodes behind --context shared
keys (30 own keys each): the shared-prefix cascade (the prefix's whole chunks of 256 keys
attended once for all rows, then each row's own keys folded on) against paged_attention
reading the prefix per sequence. Prints markdown tables, per layer.

    .venv/bin/python scripts/bench_cpu_attention.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from radixrt.native.build import load_native

HQ, HKV, HEAD_DIM = 9, 3, 64  # SmolLM2-135M
CHUNK = 256  # the kernel's chunk of keys (radixrt::attention_key_chunk)


def workloads(prefill: int, context: int) -> list[tuple[str, int, int, int]]:
    """(name, sequences, new tokens each, keys each)."""
    return [
        (f"prefill {prefill}", 1, prefill, prefill),
        (f"16 x 5 new after {context}", 16, 5, context),
        (f"decode 64 x {context}", 64, 1, context),
    ]


def timed(fn, seconds: float) -> float:
    """Median milliseconds per call over `seconds` of calls (after two warm-ups): the median,
    because this machine is shared and bursts of other work hit single calls."""
    fn()
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def sdpa(q, k, v, seqs: int, new: int, keys: int, scale: float) -> torch.Tensor:
    """Per batch: [B, Hq, new, D] against [B, Hq, keys, D], bottom-right causal."""
    qb = q.view(seqs, new, HQ, HEAD_DIM).transpose(1, 2)
    kb = k.view(seqs, keys, HKV, HEAD_DIM).transpose(1, 2).repeat_interleave(HQ // HKV, 1)
    vb = v.view(seqs, keys, HKV, HEAD_DIM).transpose(1, 2).repeat_interleave(HQ // HKV, 1)
    if new == 1:
        return F.scaled_dot_product_attention(qb, kb, vb, scale=scale)
    mask = torch.arange(keys)[None, :] <= torch.arange(keys - new, keys)[:, None]
    return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)


def measure(ops, dtype: torch.dtype, seqs: int, new: int, keys: int, seconds: float):
    gen = torch.Generator().manual_seed(0)
    pool = seqs * keys
    q = torch.randn(seqs * new, HQ, HEAD_DIM, generator=gen).to(dtype)
    k_cache = torch.randn(pool, HKV, HEAD_DIM, generator=gen).to(dtype)
    v_cache = torch.randn(pool, HKV, HEAD_DIM, generator=gen).to(dtype)
    slots = torch.randperm(pool, generator=gen)
    qo = torch.arange(seqs + 1) * new
    kv = torch.arange(seqs + 1) * keys
    scale = HEAD_DIM**-0.5
    k, v = k_cache[slots].contiguous(), v_cache[slots].contiguous()
    out, _ = ops.paged_attention(q, k_cache, v_cache, qo, kv, slots, scale, 0, [], [])
    expected = sdpa(q, k, v, seqs, new, keys, scale).transpose(1, 2).reshape(out.shape)
    # Both compute the same thing (bf16 rounds its output to 2^-8): else the timing means nothing.
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=0)
    native_ms = timed(
        lambda: ops.paged_attention(q, k_cache, v_cache, qo, kv, slots, scale, 0, [], []), seconds
    )
    sdpa_ms = timed(lambda: sdpa(q, k, v, seqs, new, keys, scale), seconds)
    return native_ms, sdpa_ms


def measure_cascade(ops, dtype: torch.dtype, shared: int, seconds: float, seqs: int = 64):
    """(cascade ms, per-sequence ms) for `seqs` decodes behind `shared` common slots."""
    own = 30
    gen = torch.Generator().manual_seed(1)
    pool = shared + seqs * own
    q = torch.randn(seqs, HQ, HEAD_DIM, generator=gen).to(dtype)
    k_cache = torch.randn(pool, HKV, HEAD_DIM, generator=gen).to(dtype)
    v_cache = torch.randn(pool, HKV, HEAD_DIM, generator=gen).to(dtype)
    slots = torch.randperm(pool, generator=gen)
    prefix, own_slots = slots[:shared], slots[shared:]
    whole = shared // CHUNK * CHUNK  # the cascade's part: whole chunks of the prefix
    qo = torch.arange(seqs + 1)
    full = torch.cat([torch.cat([prefix, s]) for s in own_slots.view(seqs, own)])
    full_indptr = torch.arange(seqs + 1) * (shared + own)
    rest = torch.cat([torch.cat([prefix[whole:], s]) for s in own_slots.view(seqs, own)])
    rest_indptr = torch.arange(seqs + 1) * (shared - whole + own)
    rows, scale = torch.arange(seqs), HEAD_DIM**-0.5

    def cascade() -> torch.Tensor:
        return ops.paged_attention(
            q, k_cache, v_cache, qo, rest_indptr, rest, scale, 0, [rows], [prefix[:whole]]
        )[0]

    def per_sequence() -> torch.Tensor:
        return ops.paged_attention(q, k_cache, v_cache, qo, full_indptr, full, scale, 0, [], [])[0]

    assert torch.equal(cascade(), per_sequence())  # the cascade changes no bit
    return timed(cascade, seconds), timed(per_sequence, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, default=2000)
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per cell")
    args = parser.parse_args()
    ops = load_native()
    if ops is None:
        raise SystemExit("native CPU kernels unavailable (no compiler/ninja, or disabled)")
    print(f"threads: {torch.get_num_threads()}, shapes: Hq {HQ}, Hkv {HKV}, D {HEAD_DIM}\n")
    print("| workload | dtype | native ms | SDPA ms | SDPA / native | native GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for name, seqs, new, keys in workloads(args.prefill, args.context):
        # Score and P @ V: 4 flops per (query row, visible key, dim).
        visible = seqs * HQ * sum(keys - new + t + 1 for t in range(new))
        for dtype in (torch.float32, torch.bfloat16):
            native_ms, sdpa_ms = measure(ops, dtype, seqs, new, keys, args.seconds)
            gflops = 4 * visible * HEAD_DIM / native_ms / 1e6
            dt = str(dtype).removeprefix("torch.")
            print(
                f"| {name} | {dt} | {native_ms:.2f} | {sdpa_ms:.2f} | "
                f"{sdpa_ms / native_ms:.2f}x | {gflops:.0f} |"
            )
    print("\n| 64 decodes behind shared keys | dtype | cascade ms | per sequence ms | ratio |")
    print("|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        cascade_ms, per_seq_ms = measure_cascade(ops, dtype, args.context, args.seconds)
        dt = str(dtype).removeprefix("torch.")
        print(
            f"| {args.context} shared + 30 own | {dt} | {cascade_ms:.2f} | {per_seq_ms:.2f} | "
            f"{per_seq_ms / cascade_ms:.2f}x |"
        )


if __name__ == "__main__":
    main()
