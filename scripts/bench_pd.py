"""Prefill/decode disaggregation on a 2-core CPU: does the ITL tail of decoding streams stop
depending on other requests' prefills, and what does moving the KV pages cost?

    python scripts/bench_pd.py                      # the full run, ~3-6 minutes
    python scripts/bench_pd.py --quick              # a ~1 minute smoke
    python scripts/bench_pd.py --out pd.json --server-args "--chunked-prefill-size 1024"

One seeded workload, sent identically to two setups:
(a) one `radixrt launch --num-threads 2` pinned to cores 0,1 (taskset), requests sent to it;
(b) a prefill server (`--disaggregation-mode prefill`, core 0, 1 thread) and a decode server
    (`--disaggregation-mode decode`, core 1, 1 thread) behind `smg launch --pd-disaggregation`
    (unpinned), requests sent to SMG.
Both use --page-size 16 (the transfer moves whole pages) and the same model (default: the
default model). The workload: --chats chat streams (~30-100 prompt tokens, ignore_eos, greedy)
arriving as a Poisson process at --chat-rate, and --docs long documents (completions of
--doc-tokens prompt tokens of random words from local text, fitted with the first server's
/tokenize; --doc-output tokens) arriving at seeded times among them. Defaults: 120 chats at
1.5/s with 64-128 output tokens, 4 documents of 4,000-8,000 tokens with 1-16. Everything
streams (bench_serving.send: SSE, TTFT/ITL per chunk); (b) keeps the servers' own
--disaggregation-transfer-timeout unless --transfer-timeout says otherwise.

Reported from the chat streams only: TTFT p50/p99, TPOT p50, ITL p50/p99 (and split into the
gaps that overlap some document's prefill window, from its send to its first token, and the
rest), output throughput, and goodput: chats with TTFT < --slo-ttft and their own ITL p99 <
--slo-itl (default: TTFT < 2 s and ITL p99 < 200 ms), as a fraction and a rate. The
documents' TTFT p50 is given for context.

Transfer against recompute: the servers' /server_info counters over the run
(disagg_transfer_seconds is the time each side spent moving pages: gather and send on the
prefill side, store once received on the decode side; wire and queue time are in neither),
per 1,000 tokens and per page, against the prefill cost of a document of the mean length
measured on an idle server: (a) with 2 threads, and the prefill server directly (1 thread,
what recomputing on the decode core would cost); plus one document through SMG while idle.
Then the CPU time other processes took during each run (the figures assume a quiet machine),
and the warnings, errors and aborts in every child's log (the logs stay in a temp folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import bench_pd_launch as pl
import bench_serving_launch as launch
import httpx
from bench_pd_report import report
from bench_serving import Result, percentile, send, summarize
from bench_serving_workloads import ASKS, FILLER, ITEMS, NAMES, TOPICS, Request

# Plain words for the documents (one token each with SmolLM2's tokenizer, mostly); the
# lengths are trimmed against the server's own /tokenize anyway.
DOC_WORDS = sorted(
    {w.strip(".,").lower() for s in FILLER + ASKS + TOPICS for w in s.split()}
    | {w.lower() for w in NAMES + ITEMS}
    | set("the of and to in is was for on that with as by at from it an are were".split())
)
QUICK = {
    "chats": 16,
    "chat_rate": 2.0,
    "chat_output": "32,64",
    "docs": 1,
    "doc_tokens": "3000,4000",
}


# -- workload -----------------------------------------------------------------------------
def chat_requests(args: argparse.Namespace, rng: random.Random) -> list[tuple[float, Request]]:
    """(arrival s, request): Poisson arrivals; 5-60 words of question and asides after the
    chat template's ~30 tokens make ~30-100 prompt tokens."""
    lo, hi = args.chat_output
    out, at = [], 0.0
    for _ in range(args.chats):
        at += rng.expovariate(args.chat_rate)
        words = f"{rng.choice(ASKS)} {rng.choice(TOPICS)}.".split()
        words += " ".join(rng.sample(FILLER, len(FILLER))).split()
        text = " ".join(words[: rng.randint(5, 60)])
        out.append((at, Request(rng.randint(lo, hi), messages=[{"role": "user", "content": text}])))
    return out


def doc_texts(
    args: argparse.Namespace, rng: random.Random, n: int, tag: str
) -> tuple[list[list[str]], list[int]]:
    """n documents as word lists, each a distinct heading then random words, and their token
    targets drawn from --doc-tokens (a word is about a token; `fit_docs` makes it exact)."""
    lo, hi = args.doc_tokens
    docs, targets = [], []
    for i in range(n):
        targets.append(rng.randint(lo, hi))
        body = [rng.choice(DOC_WORDS) for _ in range(targets[-1] - 8)]
        docs.append([f"Report {tag}-{i}:", *body, "\nSummary:"])
    return docs, targets


def fit_docs(url: str, docs: list[list[str]], targets: list[int]) -> list[str]:
    """Trim or pad each document's body until the server's tokenizer counts its target."""
    for _ in range(6):
        texts = [" ".join(d) for d in docs]
        counts = _token_counts(url, texts)
        if counts == targets:
            return texts
        for d, have, want in zip(docs, counts, targets, strict=True):
            if have > want:
                del d[-1 - (have - want) : -1]
            elif have < want:
                d[-1:-1] = d[1 : 1 + want - have]
    return [" ".join(d) for d in docs]  # close enough: the report uses the usage counts


def _token_counts(url: str, texts: list[str]) -> list[int]:
    resp = httpx.post(f"{url}/tokenize", json={"prompt": texts}, timeout=120)
    resp.raise_for_status()
    return resp.json()["count"]


def build_workload(args: argparse.Namespace, url: str) -> list[tuple[float, str, Request]]:
    """The timeline both setups get: chats, and documents spread over 10-80% of the chats'
    span (each in its own slot, jittered), so that every document lands among streams."""
    rng = random.Random(f"bench-pd-{args.seed}")
    chats = chat_requests(args, rng)
    span = chats[-1][0] if chats else 60.0
    texts = fit_docs(url, *doc_texts(args, rng, args.docs, f"{args.seed}"))
    lo, hi = args.doc_output
    timeline = [(at, "chat", r) for at, r in chats]
    for i, text in enumerate(texts):
        at = span * (0.1 + 0.7 * (i + rng.random()) / max(1, args.docs))
        timeline.append((at, "doc", Request(rng.randint(lo, hi), prompt=text)))
    return sorted(timeline, key=lambda t: t[0])


# -- running ------------------------------------------------------------------------------
async def run_timeline(
    url: str, model: str, timeline: list[tuple[float, str, Request]], timeout: float
) -> tuple[list[tuple[str, float, Result]], float]:
    """Send each request at its arrival time; (kind, send time s, result) and the wall span."""
    limits = httpx.Limits(max_connections=len(timeline) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        start = time.perf_counter()

        async def one(at: float, kind: str, req: Request) -> tuple[str, float, Result]:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            sent = time.perf_counter() - start
            return kind, sent, await send(client, req, model)

        done = await asyncio.gather(*(one(*t) for t in timeline))
    return list(done), time.perf_counter() - start


def measure_prefill(url: str, model: str, text: str) -> dict[str, Any]:
    """One document, alone, 1 output token: its TTFT is (about) its prefill."""
    res = asyncio.run(_send_one(url, model, Request(1, prompt=text)))
    if not res.ok:
        raise RuntimeError(f"the prefill measurement failed at {url}: {res.error}")
    tokens = res.prompt_tokens
    return {"tokens": tokens, "ttft_s": res.ttft, "ms_per_1k": 1e6 * res.ttft / max(1, tokens)}


async def _send_one(url: str, model: str, req: Request) -> Result:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        return await send(client, req, model)


# -- metrics ------------------------------------------------------------------------------
def prefill_windows(runs: list[tuple[str, float, Result]]) -> list[tuple[float, float]]:
    return [(sent, sent + r.ttft) for kind, sent, r in runs if kind == "doc" and r.ok]


def split_itl(
    runs: list[tuple[str, float, Result]], windows: list[tuple[float, float]]
) -> tuple[list[float], list[float]]:
    """The chats' ITL gaps that overlap some document's prefill window, and the others."""
    inside: list[float] = []
    outside: list[float] = []
    for kind, sent, r in runs:
        if kind != "chat" or not r.ok:
            continue
        t = sent + r.ttft
        for gap in r.itl:
            hit = any(a < t + gap and t < b for a, b in windows)
            (inside if hit else outside).append(gap)
            t += gap
    return inside, outside


def chat_metrics(args: argparse.Namespace, runs: list, duration: float) -> dict:
    chats = [r for kind, _, r in runs if kind == "chat"]
    docs = [r for kind, _, r in runs if kind == "doc"]
    s = summarize(chats, duration)
    good = [
        r
        for r in chats
        if r.ok and r.ttft < args.slo_ttft and (not r.itl or percentile(r.itl, 99) < args.slo_itl)
    ]
    inside, outside = split_itl(runs, prefill_windows(runs))
    d: dict[str, Any] = summarize(docs, duration)
    return {
        **s,
        "chats": len(chats),
        "goodput_fraction": len(good) / len(chats) if chats else math.nan,
        "goodput_rps": len(good) / duration,
        "itl_during_prefill_ms": [percentile(inside, q) * 1000 for q in (50, 99)],
        "itl_outside_prefill_ms": [percentile(outside, q) * 1000 for q in (50, 99)],
        "itl_gaps_during_prefill": len(inside),
        "doc_ttft_ms_p50": d["ttft_ms"][0],
        "docs_completed": d["completed"],
        "docs_failed": d["failed"],
        "doc_prompt_tokens": [r.prompt_tokens for r in docs if r.ok],
        "chat_prompt_tokens": _span([r.prompt_tokens for r in chats if r.ok]),
        "chat_output_tokens": _span([r.output_tokens for r in chats if r.ok]),
        "errors": sorted({r.error for _, _, r in runs if not r.ok})[:5],
        "requests": [_raw(kind, sent, r) for kind, sent, r in runs],
    }


def _raw(kind: str, sent: float, r: Result) -> dict:
    """One request's record for --out (seconds from the run's start; ITL gaps in order)."""
    keep = ("ok", "error", "prompt_tokens", "output_tokens", "ttft", "latency", "itl")
    return {"kind": kind, "sent": sent, **{k: getattr(r, k) for k in keep}}


def _span(xs: list[int]) -> list[int]:
    return [min(xs), max(xs)] if xs else []


# -- the two setups -----------------------------------------------------------------------
def server_flags(args: argparse.Namespace) -> list[str]:
    model = ["--model-path", args.model_path] if args.model_path else []
    return ["--page-size", str(args.page_size), *model, *shlex.split(args.server_args)]


def prepare(args: argparse.Namespace, url: str, work: dict) -> str:
    """The served model's name; on the first server, the workload (its tokenizer fits the
    documents) and two idle-measurement documents of the mean length."""
    model = launch.first_model(url, None)
    launch.warm_up(url, model, None)
    if "timeline" not in work:
        limit = pl.server_info(url)["context_length"]
        if args.doc_tokens[1] + args.doc_output[1] > limit:
            raise SystemExit(
                f"--doc-tokens up to {args.doc_tokens[1]} + {args.doc_output[1]} output "
                f"exceed the context ({limit}): add --context-length to --server-args"
            )
        work["timeline"] = build_workload(args, url)
        mean = sum(args.doc_tokens) // 2
        rngs = [random.Random(f"probe-{args.seed}-{i}") for i in (0, 1)]
        probes = [[f"Probe {i}:", *r.choices(DOC_WORDS, k=mean)] for i, r in enumerate(rngs)]
        work["probes"] = fit_docs(url, probes, [mean, mean])
    return model


def run_load(args: argparse.Namespace, url: str, model: str, work: dict, sides: list) -> dict:
    """The timeline against `url` (`sides`: the servers and gateway behind it); the chat
    metrics, the counters each server moved, and the CPU time others took meanwhile."""
    servers = [c for c in sides if c.name != "smg"]
    before, cpu = [pl.counters(c.url) for c in servers], pl.cpu_seconds(sides)
    n = len(work["timeline"])
    print(f"  sending {n} requests to {url}", file=sys.stderr, flush=True)
    runs, duration = asyncio.run(run_timeline(url, model, work["timeline"], args.timeout))
    machine, ours = (b - a for a, b in zip(cpu, pl.cpu_seconds(sides), strict=True))
    moved = {c.name: pl.delta(pl.counters(c.url), b) for c, b in zip(servers, before, strict=True)}
    others = {"busy_s": machine, "ours_s": ours, "others_s": max(0.0, machine - ours)}
    others["others_pct"] = 100 * others["others_s"] / (len(os.sched_getaffinity(0)) * duration)
    return {**chat_metrics(args, runs, duration), "counters": moved, "cpu": others}


def bench_single(args: argparse.Namespace, log_dir: str, work: dict) -> dict:
    cmd = pl.server_cmd("0,1", 2, launch._free_port(), server_flags(args))
    with pl.servers([("single", cmd)], args.launch_timeout, log_dir) as (single,):
        model = prepare(args, single.url, work)
        prefill = measure_prefill(single.url, model, work["probes"][0])
        out = run_load(args, single.url, model, work, [single])
        out["logs"] = {single.name: pl.notable_lines(single)}
    return {**out, "prefill_idle": prefill, "commands": {"single": shlex.join(cmd)}}


def bench_disaggregated(args: argparse.Namespace, log_dir: str, work: dict) -> dict:
    bootstrap = launch._free_port()
    timeout = args.transfer_timeout
    pd = [] if timeout is None else ["--disaggregation-transfer-timeout", str(timeout)]
    prefill_flags = ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port"]
    specs = [
        ("prefill", pl.server_cmd("0", 1, launch._free_port(), server_flags(args))),
        ("decode", pl.server_cmd("1", 1, launch._free_port(), server_flags(args))),
    ]
    specs[0][1].extend([*prefill_flags, str(bootstrap), *pd])
    specs[1][1].extend(["--disaggregation-mode", "decode", *pd])
    with (
        pl.servers(specs, args.launch_timeout, log_dir) as (prefill, decode),
        pl.pd_gateway(args.smg, prefill, bootstrap, decode, log_dir) as smg,
    ):
        model = prepare(args, prefill.url, work)
        launch.warm_up(smg.url, model, None)
        direct = measure_prefill(prefill.url, model, work["probes"][0])
        before = [pl.counters(c.url) for c in (prefill, decode)]
        via_smg = measure_prefill(smg.url, model, work["probes"][1])
        via_smg["counters"] = {
            c.name: pl.delta(pl.counters(c.url), b)
            for c, b in zip((prefill, decode), before, strict=True)
        }
        out = run_load(args, smg.url, model, work, [prefill, decode, smg])
        out["logs"] = {c.name: pl.notable_lines(c) for c in (prefill, decode, smg)}
    commands = {c: shlex.join(cmd) for c, cmd in specs} | {"smg": shlex.join(smg.cmd)}
    return {**out, "prefill_idle": direct, "via_smg_idle": via_smg, "commands": commands}


# -- main ---------------------------------------------------------------------------------
def _pair(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~1 minute smoke: " + str(QUICK))
    p.add_argument("--chats", type=int, default=120, help="chat streams")
    p.add_argument("--chat-rate", type=float, default=1.5, help="chat arrivals per second")
    p.add_argument("--chat-output", default="64,128", help="output tokens, min,max")
    p.add_argument("--docs", type=int, default=4, help="long documents among the chats")
    p.add_argument("--doc-tokens", default="4000,8000", help="document prompt tokens, min,max")
    p.add_argument("--doc-output", default="1,16", help="document output tokens, min,max")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="goodput: TTFT below, seconds")
    p.add_argument("--slo-itl", type=float, default=0.2, help="goodput: ITL p99 below, seconds")
    p.add_argument("--page-size", type=int, default=16, help="KV page size, both setups")
    p.add_argument("--model-path", default=None, help="default: radixrt's default model")
    p.add_argument("--server-args", default="", help="extra flags for every radixrt server")
    p.add_argument(
        "--transfer-timeout",
        type=float,
        default=None,
        help="--disaggregation-transfer-timeout of both (b) servers; default: the servers' own "
        "(the decode side counts silence: the prefill server's KVWait keeps a queued room alive)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    p.add_argument("--launch-timeout", type=float, default=300.0)
    p.add_argument("--smg", default=None, help="the smg executable; default: on PATH")
    p.add_argument("--out", default=None, help="write the raw numbers to this JSON file")
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    for k in ("chat_output", "doc_tokens", "doc_output"):
        setattr(args, k, _pair(getattr(args, k)))
    args.smg = args.smg or shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
    if not Path(args.smg).exists():
        p.error(f"--smg: no smg executable at {args.smg} (pip install smg)")
    if len(os.sched_getaffinity(0)) < 2:
        p.error("needs 2 CPUs (cores 0 and 1) to pin the servers to")
    if args.chats < 1 or args.chat_rate <= 0 or args.docs < 0:
        p.error("--chats >= 1, --chat-rate > 0, --docs >= 0")
    return args


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so that every `finally` stops what it started."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # Ctrl-C too, even where the shell that started us ignores it (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log_dir = pl.new_log_dir()
    work: dict[str, Any] = {}  # the workload, built on the first server
    print(f"logs: {log_dir}", file=sys.stderr, flush=True)
    started = time.monotonic()
    single = bench_single(args, log_dir, work)
    disagg = bench_disaggregated(args, log_dir, work)
    command = "python " + shlex.join(sys.argv if argv is None else ["bench_pd.py", *argv])
    print(report(args, single, disagg, pl.cpu_header(), command))
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.out:
        raw = {"args": vars(args), "command": command, "cpu": pl.cpu_header()}
        with open(args.out, "w") as f:
            json.dump({**raw, "single": single, "disaggregated": disagg}, f, indent=2)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted; everything started was stopped")
