"""scripts/bench_kernels.py --sweep: its two timed workloads under other tilings (decode:
splits, keys per block, warps, pipeline stages; extend: BLOCK_M, BLOCK_N, warps, stages), each
checked against the reference; the default's row is marked."""

from __future__ import annotations

import torch
from bench_kernels import (
    PEAK_BF16_FLOP_S,
    PEAK_HBM_BYTES_S,
    bench_ms,
    close,
    decode_batch,
    decode_fn,
    extend_batch,
    extend_fn,
    ref_out,
)

from radixrt.kernels import decode_attention as decode_module
from radixrt.kernels import reference
from radixrt.kernels.decode_attention import choose_num_splits
from radixrt.kernels.extend_attention import _launch_config

DECODE_TILINGS = [(4, 2), (4, 3), (8, 3)]  # (num_warps, num_stages)
EXTEND_TILINGS = [
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
]


def sweep_decode(dtype: torch.dtype, sms: int) -> list[list[str]]:
    """Every (splits, keys per block, warps, stages) on the decode workload."""
    b, kv_bytes = decode_batch(dtype)
    want = ref_out(b)
    default = (
        choose_num_splits(64, 8, 4096, sms),
        decode_module.BLOCK_N,
        decode_module.NUM_WARPS,
        decode_module.NUM_STAGES,
    )
    rows = []
    for splits in (2, 4, 8, 16):
        for block_n in (64, 128):
            for warps, stages in DECODE_TILINGS:
                fn = decode_fn(b, splits, block_n=block_n, num_warps=warps, num_stages=stages)
                ok = close(fn(), want, dtype)
                ms = bench_ms(fn)
                mark = " (default)" if (splits, block_n, warps, stages) == default else ""
                rows.append([
                    f"{splits} splits, {block_n} keys/block, {warps} warps, {stages} stages{mark}",
                    "PASS" if ok else "FAIL",
                    f"{ms * 1e3:.0f} us",
                    f"{kv_bytes / (ms * 1e-3) / 1e9:.0f} GB/s",
                    f"{100 * kv_bytes / (ms * 1e-3) / PEAK_HBM_BYTES_S:.0f}% HBM",
                ])  # fmt: skip
    return rows


def sweep_extend(dtype: torch.dtype) -> list[list[str]]:
    """Every tiling in EXTEND_TILINGS on the extend workload."""
    b, flops = extend_batch(dtype)
    want = reference.paged_attention_ref(
        b.q, b.k_buffer, b.v_buffer, b.qo_indptr, b.kv_indptr, b.kv_indices, 128**-0.5
    )
    default = _launch_config(128, b.q.device)
    rows = []
    for cfg in EXTEND_TILINGS:
        fn = extend_fn(b, cfg)
        ok = close(fn(), want.cpu(), dtype)
        ms = bench_ms(fn)
        mark = " (default)" if cfg == default else ""
        rows.append([
            ", ".join(f"{k} {v}" for k, v in cfg.items()) + mark,
            "PASS" if ok else "FAIL",
            f"{ms * 1e3:.0f} us",
            f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s",
            f"{100 * flops / (ms * 1e-3) / PEAK_BF16_FLOP_S:.0f}% bf16 peak",
        ])  # fmt: skip
    return rows


def sweep_table(title: str, rows: list[list[str]]) -> str:
    head = ["tiling", "check", "time", "achieved", "of peak"]
    lines = ["", title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
