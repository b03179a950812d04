"""Offline throughput: radixrt's Engine vs transformers on the same weights, one process, one run.

    python scripts/bench_offline.py [--workloads a,b,decode,prefill] [--quick] [--json out.json]
        [--plot out.png]

Workloads: (a) n questions behind one shared ~1,000-token 5-shot prefix, 32 new tokens each;
(b) n unrelated 20-100 token prompts, most asking 8-16 new tokens and n/16 asking 256;
decode: one prompt, 128 new tokens; prefill: one 2,000-token prompt, 1 new token.
Every request produces exactly the tokens it asked for (EOS ignored or suppressed), and output
tok/s = sum of requested max_new_tokens / wall seconds (prefill: prompt tokens / wall seconds).
Baselines: transformers' static batched `generate` (left-padded, greedy, to the batch max) and
its continuous batching manager (paged, block sharing on). Ratios are against static generate.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass

import bench_common as bc
import torch

from radixrt.loader.hf_config import resolve_dtype


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    max_new: list[int]
    unit: str = "output"  # "prompt" for the prefill workload
    with_cb: bool = True


@dataclass
class Row:
    workload: str
    system: str
    requests: int
    requested_tokens: int
    wall_s: float | None = None
    tok_s: float | None = None
    ratio: float | None = None
    cache_hit: float | None = None
    note: str = ""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="a,b,decode,prefill")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--model-path", default=None, help="a .gguf file; default: SmolLM2-135M")
    p.add_argument("--skip-hf-cb", action="store_true", help="skip transformers' CB baseline")
    p.add_argument("--quick", action="store_true", help="8 requests, short outputs (smoke test)")
    p.add_argument("--json", default=None, help="also write the results to this path")
    p.add_argument("--plot", default=None, help="also draw the table into this PNG file")
    return p.parse_args()


def build_workloads(args: argparse.Namespace, tokenizer) -> list[Workload]:
    n = 8 if args.quick else args.num_requests
    a_new, long_new, dec_new, pre_len = (8, 64, 32, 512) if args.quick else (32, 256, 128, 2000)
    b_prompts, b_new = bc.unrelated_workload(tokenizer, n, long_new)
    makers = {
        "a": lambda: Workload(
            "a: shared 5-shot prefix", bc.prefix_workload(tokenizer, n), [a_new] * n
        ),
        "b": lambda: Workload("b: unrelated, skewed outputs", b_prompts, b_new),
        "decode": lambda: Workload(
            f"decode: batch 1, {dec_new} new",
            [bc.short_question(tokenizer)],
            [dec_new],
            with_cb=False,
        ),
        "prefill": lambda: Workload(
            f"prefill: {pre_len}-token prompt",
            [bc.long_prompt(tokenizer, pre_len)],
            [1],
            unit="prompt",
            with_cb=False,
        ),
    }
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(names) - set(makers))
    if unknown:
        sys.exit(f"--workloads: unknown {unknown}; allowed: {sorted(makers)}")
    return [makers[name]() for name in names]


def counted_tokens(w: Workload) -> int:
    return sum(len(p) for p in w.prompts) if w.unit == "prompt" else sum(w.max_new)


def run_radixrt(engine, w: Workload) -> tuple[Row, list[list[int]]]:
    assert engine.flush_cache(), "flush_cache refused: requests still running"
    params = [{"max_new_tokens": m, "temperature": 0.0, "ignore_eos": True} for m in w.max_new]
    steps = engine.get_server_info().get("steps")
    start = time.perf_counter()
    outs = engine.generate(input_ids=w.prompts, sampling_params=params)
    wall = time.perf_counter() - start
    got = [len(o["output_ids"]) for o in outs]
    assert got == w.max_new, f"radixrt produced {got}, asked {w.max_new}"
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    after = engine.get_server_info().get("steps")
    note = "" if steps is None or after is None else f"{after - steps} steps"
    row = Row(
        w.name,
        "radixrt",
        len(w.prompts),
        sum(w.max_new),
        wall,
        counted_tokens(w) / wall,
        cache_hit=cached / prompt,
        note=note,
    )
    return row, [o["output_ids"] for o in outs]


def run_hf_static(model, w: Workload, eos: list[int], pad: int) -> tuple[Row, list[list[int]]]:
    wall, outs = bc.hf_static(model, w.prompts, w.max_new, eos, pad)
    return Row(
        w.name,
        "transformers generate (static)",
        len(w.prompts),
        sum(w.max_new),
        wall,
        counted_tokens(w) / wall,
    ), outs


def run_hf_cb(model, w: Workload, pad: int) -> Row:
    row = Row(w.name, "transformers continuous batching", len(w.prompts), sum(w.max_new))
    try:
        row.wall_s = bc.hf_continuous(model, w.prompts, w.max_new, pad)
        row.tok_s = counted_tokens(w) / row.wall_s
    except Exception as e:  # reported in the table, not fatal: it is a baseline
        row.note = f"n/a ({type(e).__name__}: {str(e)[:80]})"
    return row


def agreement(ours: list[list[int]], ref: list[list[int]], eos: list[int]) -> str:
    """How many outputs equal static generate's up to radixrt's first EOS (which ignore_eos
    lets through, while generate suppresses it)."""
    cut = [next((i for i, t in enumerate(o) if t in eos), len(o)) for o in ours]
    same = sum(o[:k] == r[:k] for o, r, k in zip(ours, ref, cut, strict=True))
    return f"{same}/{len(ref)} agree with static generate ({sum(cut)} tokens before EOS)"


def run_workload(w: Workload, engine, model, eos, pad, skip_cb: bool) -> list[Row]:
    log(
        f"[{w.name}] {len(w.prompts)} requests, prompt tokens {sum(map(len, w.prompts))}, "
        f"requested output tokens {sum(w.max_new)}"
    )
    ours, our_ids = run_radixrt(engine, w)
    log(f"  radixrt: {ours.wall_s:.2f} s")
    static, ref_ids = run_hf_static(model, w, eos, pad)
    log(f"  transformers static: {static.wall_s:.2f} s")
    ours.note = "; ".join(filter(None, [ours.note, agreement(our_ids, ref_ids, eos)]))
    rows = [ours, static]
    if w.with_cb and not skip_cb:
        rows.append(run_hf_cb(model, w, pad))
        log(f"  transformers CB: {rows[-1].wall_s} s {rows[-1].note}")
    for r in rows:
        r.ratio = r.wall_s and static.wall_s / r.wall_s
    return rows


def warm_up(engine, model, eos: list[int], pad: int) -> None:
    prompts = [[1, 5, 6, 7, 8], [1, 9, 10]]
    engine.generate(
        input_ids=prompts,
        sampling_params=[{"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}] * 2,
    )
    bc.hf_static(model, prompts, [4, 4], eos, pad)


def fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(rows: list[Row]) -> str:
    lines = [
        "| workload | system | requests | requested output tokens | wall s | tok/s | "
        "vs static generate | radixrt cache hit | notes |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        lines.append(
            f"| {r.workload} | {r.system} | {r.requests} | {r.requested_tokens} | "
            f"{fmt(r.wall_s, '.2f')} | {fmt(r.tok_s, '.1f')} | "
            f"{fmt(r.ratio, '.2f')}{'x' if r.ratio else ''} | "
            f"{fmt(r.cache_hit, '.1%') if r.system == 'radixrt' else ''} | {r.note} |"
        )
    return "\n".join(lines)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    args = parse_args()
    command = "python " + shlex.join(sys.argv)
    print(command, flush=True)
    import radixrt
    from radixrt.loader.default_model import default_model_path
    from radixrt.loader.tokenizer import load_tokenizer

    path = args.model_path or default_model_path()
    engine = radixrt.Engine(model_path=path, dtype=args.dtype, log_level="warning")
    model = bc.load_hf_model(path, resolve_dtype(args.dtype))
    tokenizer = load_tokenizer(path)
    eos = bc.eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    info = engine.get_server_info()
    log(
        f"model {path}\ndtype {args.dtype}, torch threads {torch.get_num_threads()}, "
        f"radixrt attention {info.get('attention_backend')}, device {info.get('device')}"
    )
    warm_up(engine, model, eos, pad)
    rows: list[Row] = []
    try:
        for w in build_workloads(args, tokenizer):
            rows += run_workload(w, engine, model, eos, pad, args.skip_hf_cb)
    finally:
        engine.shutdown()
    table = markdown(rows)
    print(
        "\ntok/s is output tok/s (sum of requested max_new_tokens / wall s), except for the "
        "prefill row: prompt tok/s.\n\n" + table
    )
    if args.plot:
        from bench_plots import plot_offline

        plot_offline([asdict(r) for r in rows], args.plot, command)
        log(f"plot written to {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"command": command, "dtype": args.dtype, "rows": [asdict(r) for r in rows]},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
