"""Triton attention kernels: check, then time against torch SDPA, then print one table.

    python scripts/bench_kernels.py               # on a GPU: checks, timings, end-to-end check
    python scripts/bench_kernels.py --cpu-smoke   # on the CPU: the checks only, tiny shapes,
                                                  # under Triton's interpreter

1. Correctness: every kernel against its torch reference (kernels/reference.py), the SDPA
   baselines against the same reference (so both sides compute the same thing), and the engine
   on the default model with attention_backend="triton" against "torch": same greedy tokens.
2. Timing (GPU only): decode attention at batch 64 x 4,096 context (GB/s of K/V read, % of peak
   HBM bandwidth) and extend attention on a ragged batch with cached prefixes (TFLOP/s, % of
   dense bf16 peak), each against SDPA on the same data gathered to contiguous tensors.
3. --sweep (GPU only): the same two workloads under other tilings (scripts/bench_kernels_sweep.py).
The table is printed and, when $OUT is set, written to $OUT/bench_kernels.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

if "--cpu-smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from radixrt.kernels import fused_layers, reference  # noqa: E402
from radixrt.kernels.decode_attention import choose_num_splits, decode_attention  # noqa: E402
from radixrt.kernels.extend_attention import extend_attention  # noqa: E402

PEAK_HBM_BYTES_S = 4.8e12  # H200
PEAK_BF16_FLOP_S = 989e12  # H200 (H100 SXM too), dense


@dataclass
class Paged:
    """A ragged batch on shuffled pages: q [T, Hq, D], pool [S, Hkv, D], the index tensors."""

    q: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    specs: list[tuple[int, int]]  # (prefix, new) per sequence


def paged(specs, hq, hkv, d, page_size, dtype, device, seed=0) -> Paged:
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-(p + n) // page_size) for p, n in specs]
    order = torch.randperm(sum(pages), generator=gen)
    first = torch.tensor([0] + pages).cumsum(0)
    slots = []
    for i, (p, n) in enumerate(specs):
        own = order[first[i] : first[i + 1]]
        slots.append((own[:, None] * page_size + torch.arange(page_size)).flatten()[: p + n])
    size = sum(pages) * page_size

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    def indptr(lens):
        return torch.tensor([0] + lens).cumsum(0).to(device)

    return Paged(
        randn(sum(n for _, n in specs), hq, d),
        randn(size, hkv, d),
        randn(size, hkv, d),
        indptr([n for _, n in specs]),
        indptr([p + n for p, n in specs]),
        torch.cat(slots).to(device),
        specs,
    )


def gathered(b: Paged, i: int, repeat: bool) -> tuple[torch.Tensor, ...]:
    """Sequence i as contiguous SDPA inputs: q [1, Hq, n, D], k/v [1, Hkv, L, D], or with
    `repeat` [1, Hq, L, D] (GQA heads repeated, for SDPA paths without enable_gqa)."""
    group = b.q.shape[1] // b.k_buffer.shape[1] if repeat else 1
    q = b.q[b.qo_indptr[i] : b.qo_indptr[i + 1]].transpose(0, 1)[None]
    slots = b.kv_indices[b.kv_indptr[i] : b.kv_indptr[i + 1]]
    k, v = (
        buf[slots].repeat_interleave(group, 1).transpose(0, 1)[None].contiguous()
        for buf in (b.k_buffer, b.v_buffer)
    )
    return q.contiguous(), k, v


def sdpa_decode_fn(b: Paged):
    """All sequences of one length (the benchmark's case) as one batched SDPA call, reading
    each kv head once (enable_gqa) as the kernel does."""
    parts = [gathered(b, i, repeat=False) for i in range(len(b.specs))]
    q, k, v = (torch.cat(x) for x in zip(*parts, strict=True))
    return lambda: (
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2).reshape(b.q.shape)
    )


def sdpa_extend_fn(b: Paged):
    """One SDPA call per sequence, causal aligned to the bottom right (new tokens last)."""
    from torch.nn.attention.bias import causal_lower_right

    parts = [gathered(b, i, repeat=True) for i in range(len(b.specs))]
    masks = [causal_lower_right(q.shape[2], k.shape[2]) for q, k, _ in parts]

    def run():
        outs = [
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            for (q, k, v), m in zip(parts, masks, strict=True)
        ]
        return torch.cat([o[0].transpose(0, 1) for o in outs])

    return run


def decode_fn(b: Paged, num_splits: int, **tiling):
    args = (b.q, b.k_buffer, b.v_buffer, b.kv_indptr, b.kv_indices, b.q.shape[-1] ** -0.5)
    return lambda: decode_attention(*args, num_splits, **tiling)


def extend_fn(b: Paged, config: dict | None = None):
    max_new = max(n for _, n in b.specs)
    return lambda: extend_attention(
        b.q,
        b.k_buffer,
        b.v_buffer,
        b.qo_indptr,
        b.kv_indptr,
        b.kv_indices,
        max_new,
        b.q.shape[-1] ** -0.5,
        config=config,
    )


def ref_out(b: Paged) -> torch.Tensor:
    return reference.paged_attention_ref(
        b.q.cpu(),
        b.k_buffer.cpu(),
        b.v_buffer.cpu(),
        b.qo_indptr.cpu(),
        b.kv_indptr.cpu(),
        b.kv_indices.cpu(),
        b.q.shape[-1] ** -0.5,
    )


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = {torch.float32: 1e-4, torch.float16: 4e-3}.get(dtype, 3e-2)
    return bool(torch.allclose(got.float().cpu(), want.float(), atol=tol, rtol=tol))


def check_attention(dev: str, dtype: torch.dtype, small: bool, sms: int) -> list[tuple]:
    rows = []
    lens = [1, 37, 300] if small else [1, 37, 1000, 4096]
    dec = paged([(n - 1, 1) for n in lens], 8, 2, 64, 16, dtype, dev)
    splits = choose_num_splits(len(lens), 2, max(lens), sms)
    want = ref_out(dec)
    rows.append(
        ("decode kernel vs reference", close(decode_fn(dec, max(splits, 3))(), want, dtype))
    )
    same = paged([(lens[-1] - 1, 1)] * 3, 8, 2, 64, 16, dtype, dev)  # SDPA: equal lengths
    rows.append(
        ("decode SDPA baseline vs reference", close(sdpa_decode_fn(same)(), ref_out(same), dtype))
    )
    specs = (
        [(0, 9), (21, 7), (16, 1), (40, 30)]
        if small
        else [(0, 300), (777, 129), (2048, 1), (1000, 1000)]
    )
    ext = paged(specs, 12, 4, 128, 16, dtype, dev)
    want = ref_out(ext)
    rows.append(("extend kernel vs reference", close(extend_fn(ext)(), want, dtype)))
    rows.append(("extend SDPA baseline vs reference", close(sdpa_extend_fn(ext)(), want, dtype)))
    return rows


def check_fused(dev: str, dtype: torch.dtype) -> list[tuple]:
    gen = torch.Generator().manual_seed(0)
    x, r = (torch.randn(6, 576, generator=gen).to(dtype).to(dev) for _ in range(2))
    w = (1 + 0.1 * torch.randn(576, generator=gen)).to(dtype).to(dev)
    ok_norm = all(
        close(a, b.cpu(), dtype)
        for a, b in zip(
            fused_layers.rmsnorm(x, w, 1e-6, r), reference.rmsnorm_ref(x, w, 1e-6, r), strict=True
        )
    )
    gu = torch.randn(6, 2 * 1536, generator=gen).to(dtype).to(dev)
    ok_silu = close(fused_layers.silu_and_mul(gu), reference.silu_and_mul_ref(gu).cpu(), dtype)
    qk = torch.randn(6, 12, 64, generator=gen).to(dtype).to(dev)
    cos, sin = (
        f(torch.randn(6, 1, 32, generator=gen)).to(dtype).to(dev) for f in (torch.cos, torch.sin)
    )
    want = reference.rotary_ref(qk, cos, sin).cpu()
    ok_rot = close(fused_layers.rotary_inplace(qk, cos, sin), want, dtype)
    return [
        ("fused RMSNorm+residual", ok_norm),
        ("fused SiLU-and-mul", ok_silu),
        ("fused rotary in place", ok_rot),
    ]


def check_engine(dev: str, max_new: int) -> list[tuple]:
    """The default model, float32: greedy tokens of the triton backend equal the torch one's."""
    import radixrt

    texts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Here is a list of fruits: apples, pears, plums. Name one more:",
    ]
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    outs = {}
    for backend in ("torch", "triton"):
        with radixrt.Engine(
            dtype="float32",
            device=dev,
            attention_backend=backend,
            in_process=True,
            max_total_tokens=16384,
        ) as engine:
            ids = [engine.tokenizer.encode(t) for t in texts]
            first = engine.generate(input_ids=ids, sampling_params=params)
            again = engine.generate(input_ids=ids[2], sampling_params=params)  # cached prefix
            outs[backend] = [o["output_ids"] for o in first] + [again["output_ids"]]
    return [("engine greedy, default model: triton == torch", outs["triton"] == outs["torch"])]


def bench_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200)


def decode_batch(dtype: torch.dtype) -> tuple[Paged, int]:
    """Batch 64 x 4,096 keys, Llama-3-8B heads (Hq 32, Hkv 8, D 128); the bytes a step reads."""
    b = paged([(4095, 1)] * 64, 32, 8, 128, 16, dtype, "cuda")
    return b, 2 * 64 * 4096 * 8 * 128 * b.k_buffer.element_size() + 64 * 4096 * 8  # K, V, slots


EXTEND_SPECS = [
    (0, 2048),
    (512, 256),
    (1024, 1024),
    (2048, 128),
    (3000, 700),
    (100, 2048),
    (4000, 64),
    (1500, 1000),
]


def extend_batch(dtype: torch.dtype) -> tuple[Paged, int]:
    """8 ragged sequences with cached prefixes, Hq 32, Hkv 8, D 128; the step's FLOPs: two
    matmuls (QK^T, PV) of 2 flops per multiply-add over every visible (query, key) pair."""
    pairs = sum(n * p + n * (n + 1) // 2 for p, n in EXTEND_SPECS)
    return paged(EXTEND_SPECS, 32, 8, 128, 16, dtype, "cuda"), 4 * pairs * 32 * 128


def time_decode(dtype: torch.dtype, sms: int) -> list[list[str]]:
    b, kv_bytes = decode_batch(dtype)
    splits = choose_num_splits(64, 8, 4096, sms)
    ours, base = bench_ms(decode_fn(b, splits)), bench_ms(sdpa_decode_fn(b))
    bw = [kv_bytes / (t * 1e-3) for t in (ours, base)]
    return [
        [
            f"decode 64 x 4096, Hq 32 / Hkv 8, D 128, {splits} splits",
            f"{ours * 1e3:.0f} us",
            f"{bw[0] / 1e9:.0f} GB/s",
            f"{100 * bw[0] / PEAK_HBM_BYTES_S:.0f}% HBM",
            f"{base * 1e3:.0f} us",
            f"{bw[1] / 1e9:.0f} GB/s",
            f"{base / ours:.2f}x",
        ]
    ]


def time_extend(dtype: torch.dtype) -> list[list[str]]:
    b, flops = extend_batch(dtype)
    ours, base = bench_ms(extend_fn(b)), bench_ms(sdpa_extend_fn(b))
    rate = [flops / (t * 1e-3) for t in (ours, base)]
    return [
        [
            f"extend, 8 ragged seqs, prefixes 0-4000, {sum(n for _, n in b.specs)} new tokens",
            f"{ours * 1e3:.0f} us",
            f"{rate[0] / 1e12:.0f} TFLOP/s",
            f"{100 * rate[0] / PEAK_BF16_FLOP_S:.0f}% bf16 peak",
            f"{base * 1e3:.0f} us",
            f"{rate[1] / 1e12:.0f} TFLOP/s",
            f"{base / ours:.2f}x",
        ]
    ]


def table(checks: list[tuple], timings: list[list[str]], header: str) -> str:
    lines = [header, "", "| check | result |", "|---|---|"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} |" for name, ok in checks]
    if timings:
        lines += [
            "",
            "| kernel | triton | achieved | of peak | SDPA | SDPA achieved | speedup |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in timings]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="checks only, tiny shapes, on the CPU under the interpreter",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--skip-engine", action="store_true", help="skip the end-to-end check")
    parser.add_argument("--sweep", action="store_true", help="also time other tilings (GPU)")
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --cpu-smoke for the checks alone")
    dev = "cpu" if args.cpu_smoke else "cuda"
    dtype = torch.float32 if args.cpu_smoke else getattr(torch, args.dtype)
    sms = 2 if args.cpu_smoke else torch.cuda.get_device_properties(0).multi_processor_count
    checks = check_attention(dev, dtype, args.cpu_smoke, sms) + check_fused(dev, dtype)
    if not args.skip_engine:
        checks += check_engine(dev, 4 if args.cpu_smoke else 16)
    timings = []
    if not args.cpu_smoke and all(ok for _, ok in checks):
        timings = time_decode(dtype, sms) + time_extend(dtype)
    device = "CPU (interpreter)" if args.cpu_smoke else torch.cuda.get_device_name(0)
    text = table(
        checks, timings, f"bench_kernels on {device}, {str(dtype)[6:]}, torch {torch.__version__}"
    )
    if timings and args.sweep:
        from bench_kernels_sweep import sweep_decode, sweep_extend, sweep_table

        text += sweep_table("Decode tilings, batch 64 x 4096", sweep_decode(dtype, sms))
        text += sweep_table("Extend tilings, the same ragged batch", sweep_extend(dtype))
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_kernels.md"), "w") as f:
            f.write(text + "\n")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
