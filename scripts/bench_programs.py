"""Benchmark DSL programs (the SGLang paper's kinds of workloads) with the radix cache on and off.

    python scripts/bench_programs.py                      # every workload, default sizes
    python scripts/bench_programs.py --workload five_shot_select --num-programs 64
    python scripts/bench_programs.py --output bench_programs.md

Each workload (scripts/bench_programs_workloads.py: five_shot_select, tree_of_thought,
multi_turn_chat, few_shot_gen) runs as one `run_batch(..., temperature=0)` through the DSL
against a `radixrt launch` server, first one with the radix cache on, then one with
`--disable-radix-cache` (started one after another, never both at once), both in this run.
The cache is flushed before every workload so that no run profits from an earlier one.

Reported per workload and server: programs/s; generated tokens/s; the prompt tokens and the
cache hit rate (cached / prompt tokens over every request of the batch, from
`states.get_meta_info()`); and the speedup, programs/s with the cache on / off.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass

import bench_programs_workloads as wl
import bench_serving_launch as launch

import radixrt as rt

SERVERS = (("cache on", []), ("cache off", ["--disable-radix-cache"]))


@dataclass
class Run:
    programs: int
    failed: int
    seconds: float
    meta: dict  # BatchResult.get_meta_info(): prompt/cached/completion tokens, hit rate

    @property
    def programs_per_s(self) -> float:
        return self.programs / self.seconds

    @property
    def gen_tokens_per_s(self) -> float:
        return self.meta["completion_tokens"] / self.seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=[*wl.WORKLOADS, "all"], default="all")
    p.add_argument(
        "--num-programs",
        type=int,
        default=None,
        help="programs per workload; default: "
        + ", ".join(f"{name} {n}" for name, (_, _, n) in wl.WORKLOADS.items()),
    )
    p.add_argument(
        "--num-threads",
        type=int,
        default=16,
        help="run_batch's num_threads: programs in flight at once",
    )
    p.add_argument("--seed", type=int, default=0, help="of the synthetic inputs")
    p.add_argument("--output", default=None, help="also write the table to this .md file")
    p.add_argument(
        "--server-args",
        default="",
        help="extra `radixrt launch` flags for both servers, one string",
    )
    p.add_argument(
        "--launch-timeout", type=float, default=600.0, help="seconds to wait for /health"
    )
    p.set_defaults(api_key=None)  # bench_serving_launch.launched reads it
    args = p.parse_args(argv)
    if args.num_programs is not None and args.num_programs < 1:
        p.error("--num-programs must be >= 1")
    args.workloads = list(wl.WORKLOADS) if args.workload == "all" else [args.workload]
    return args


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def flush(backend: rt.RuntimeEndpoint) -> None:
    """The server refuses a flush while requests run (the last program's may still be
    finishing on its side), so retry for a while."""
    for _ in range(40):
        if backend.flush_cache():
            return
        time.sleep(0.25)
    raise RuntimeError(
        "the server kept refusing /flush_cache; a cached prefix would skew the next workload"
    )


def warm_up(backend: rt.RuntimeEndpoint, url: str) -> None:
    """First-call costs (HTTP, ZeroMQ, the logprob and fork paths) stay out of the numbers."""
    launch.warm_up(url, launch.first_model(url, None), None)
    wl.warm_up_program.run(backend=backend, temperature=0)


def run_workload(backend: rt.RuntimeEndpoint, name: str, args: argparse.Namespace) -> Run:
    program, inputs = wl.build(name, args.num_programs, args.seed)
    flush(backend)
    start = time.perf_counter()
    states = program.run_batch(inputs, backend=backend, temperature=0, num_threads=args.num_threads)
    seconds = time.perf_counter() - start
    errors = [s.error() for s in states if s.error() is not None]
    if errors:
        log(f"  {name}: {len(errors)} of {len(states)} programs failed; first: {errors[0]!r}")
    return Run(len(states), len(errors), seconds, states.get_meta_info())


def bench_server(
    label: str, extra: list[str], args: argparse.Namespace
) -> tuple[dict[str, Run], str]:
    """Start one server, run every chosen workload on it, stop it. Also returns what it
    served ("model, dtype on device"), for the report."""
    runs = {}
    with launch.launched(args, extra) as url:
        backend = rt.RuntimeEndpoint(url)
        try:
            info = backend.get_server_info()
            served = (
                f"{backend.get_model_info().get('served_model_name')}, "
                f"{info.get('dtype')} on {info.get('device')}"
            )
            warm_up(backend, url)
            for name in args.workloads:
                log(f"[{label}] {name} ...")
                runs[name] = run_workload(backend, name, args)
                r = runs[name]
                log(
                    f"[{label}] {name}: {r.programs} programs in {r.seconds:.1f} s, "
                    f"hit rate {r.meta['cache_hit_rate']:.1%}"
                )
        finally:
            backend.shutdown()
    return runs, served


def _cells(r: Run) -> list[str]:
    m = r.meta
    hit = f"{m['cache_hit_rate']:.1%} ({m['cached_tokens']:,} / {m['prompt_tokens']:,})"
    return [f"{r.programs_per_s:.2f}", f"{r.gen_tokens_per_s:.1f}", hit, f"{r.seconds:.1f}"]


def markdown(results: dict[str, dict[str, Run]], workloads: list[str]) -> str:
    """One row per workload: cache on, cache off, and the programs/s ratio."""
    sides = [label for label, _ in SERVERS]
    head = ["workload", "programs"]
    for side in sides:
        head += [
            f"{side}: programs/s",
            f"{side}: gen tok/s",
            f"{side}: hit rate (cached / prompt tok)",
            f"{side}: wall s",
        ]
    head.append("speedup (programs/s on / off)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in workloads:
        on, off = (results[side][name] for side in sides)
        failed = on.failed + off.failed
        programs = f"{on.programs}" + (f" ({failed} failed)" if failed else "")
        row = [
            name,
            programs,
            *_cells(on),
            *_cells(off),
            f"{on.programs_per_s / off.programs_per_s:.2f}x",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def report(
    results: dict[str, dict[str, Run]], args: argparse.Namespace, served: str, total_s: float
) -> str:
    note = (
        f"Both servers measured in this run, one after the other (cache on, then "
        f"`--disable-radix-cache`); {served}"
        + (f", server args `{args.server_args}`" if args.server_args else "")
        + f"; run_batch(temperature=0, num_threads={args.num_threads}), cache flushed "
        "before each workload. gen tok/s: generated tokens per second (select generates "
        "none: it scores the choices by prefill). Whole benchmark, server starts "
        f"included: {total_s:.0f} s."
    )
    return f"{markdown(results, args.workloads)}\n\n{note}\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    results, served = {}, ""
    for label, extra in SERVERS:
        results[label], served = bench_server(label, extra, args)
    text = report(results, args, served, time.perf_counter() - start)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(f"`{shlex.join(sys.orig_argv)}`\n\n{text}")


if __name__ == "__main__":
    main()
