"""Online serving benchmark for any OpenAI-compatible server (radixrt, SGLang, vLLM).

    python scripts/bench_serving.py --base-url http://127.0.0.1:30000 --workload all
    python scripts/bench_serving.py --launch --server-args "--max-total-tokens 60000"
    python scripts/bench_serving.py --compare-radix-cache --workload all --plot out.png
    python scripts/bench_serving.py --launch --request-rate 4,16,inf   # one table, three rates

Requests stream over SSE (`stream_options.include_usage`), arriving as a Poisson process at
`--request-rate` (inf: all at once). Reported per workload: request and output-token
throughput; TTFT (to the first chunk with text), TPOT ((latency - TTFT) / (tokens - 1)) and ITL
(gaps between text chunks) as p50/p95/p99 in ms; and the cache hit rate, sum of
`usage.prompt_tokens_details.cached_tokens` / sum of `usage.prompt_tokens`.

Workloads, built from local text (seeded, identical across runs):
- shared-prefix: one long few-shot prefix + a short distinct question per request (completions);
- multi-turn: conversations whose turns each extend the previous turn's messages with its
  answer (chat); a conversation's next turn is sent when its answer arrives, and conversations
  start at the request rate;
- skewed: unrelated prompts of 20-100 words; most ask 8-16 tokens, one in 16 asks 256.
Outputs are exactly max_tokens long (`ignore_eos`), so runs compare like for like.

--launch starts `radixrt launch` on a free port (extra engine flags in --server-args), waits
for /health, runs, and stops it with SIGTERM. --compare-radix-cache does that twice, the second
time with --disable-radix-cache, and prints both with ratios (cache on / cache off).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shlex
import sys
import time
from dataclasses import dataclass, field

import bench_serving_launch as launch
import httpx
from bench_serving_workloads import DEFAULT_REQUESTS, WORKLOADS, Request, build_workload


@dataclass
class Result:
    ok: bool
    error: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    text: str = ""


# -- statistics ---------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default);
    nan for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _pcts(values: list[float], scale: float = 1000.0) -> list[float]:
    return [percentile(values, q) * scale for q in (50, 95, 99)]


def summarize(results: list[Result], duration: float) -> dict[str, object]:
    """Throughputs over the wall duration; TTFT, TPOT, ITL [p50, p95, p99] in ms."""
    done = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    output = sum(r.output_tokens for r in done)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration,
        "request_throughput": len(done) / duration if duration > 0 else math.nan,
        "output_throughput": output / duration if duration > 0 else math.nan,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "ttft_ms": _pcts([r.ttft for r in done]),
        "tpot_ms": _pcts(tpot),
        "itl_ms": _pcts([gap for r in done for gap in r.itl]),
        "e2e_ms": _pcts([r.latency for r in done]),
        "cache_hit_rate": sum(r.cached_tokens for r in done) / prompt if prompt else math.nan,
    }


# -- client -------------------------------------------------------------------------------
def request_body(req: Request, model: str) -> tuple[str, dict[str, object]]:
    """(path, JSON body) of a streamed request with exact output length."""
    body: dict[str, object] = {
        "model": model,
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.messages is not None:
        return "/v1/chat/completions", {**body, "messages": req.messages}
    return "/v1/completions", {**body, "prompt": req.prompt}


def _chunk_text(chunk: dict) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    return text


async def send(client: httpx.AsyncClient, req: Request, model: str) -> Result:
    """Stream one request; time its text chunks; read usage from the last chunk."""
    path, body = request_body(req, model)
    start = time.perf_counter()
    res, last, parts, usage = Result(ok=False), start, [], None
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:200]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk, now = json.loads(line[5:]), time.perf_counter()
                if "error" in chunk:
                    res.error = str(chunk["error"].get("message"))
                    return res
                usage = chunk.get("usage") or usage
                text = _chunk_text(chunk)
                if text:
                    if parts:
                        res.itl.append(now - last)
                    else:
                        res.ttft = now - start
                    parts.append(text)
                    last = now
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.latency, res.text = time.perf_counter() - start, "".join(parts)
    if not parts:  # no visible text at all: the first "token" is the end
        res.ttft = res.latency
    return _with_usage(res, usage, len(parts))


def _with_usage(res: Result, usage: dict | None, chunks: int) -> Result:
    res.ok = True
    if usage is None:  # a server without include_usage: count text chunks as tokens
        res.output_tokens = chunks
        return res
    res.prompt_tokens = usage.get("prompt_tokens", 0)
    res.output_tokens = usage.get("completion_tokens", 0)
    res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return res


async def run_workload(
    base_url: str,
    model: str,
    reqs: list[Request],
    rate: float,
    seed: int,
    concurrency: int | None,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> tuple[list[Result], float]:
    """Send `reqs` with Poisson arrivals (a conversation's later turns follow its answers);
    returns the results and the wall duration."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(concurrency or len(reqs))
    groups = _arrival_groups(reqs)
    limits = httpx.Limits(max_connections=concurrency or len(reqs) + 4)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=timeout, limits=limits, headers=headers
    ) as client:

        async def run_group(group: list[Request]) -> list[Result]:
            history: list[dict[str, str]] = []
            out = []
            for req in group:
                if req.conversation >= 0:
                    history = history + req.messages
                    req = Request(req.max_tokens, messages=history)
                async with limit:
                    out.append(await send(client, req, model))
                history = history + [{"role": "assistant", "content": out[-1].text}]
            return out

        start, tasks = time.perf_counter(), []
        for group in groups:
            tasks.append(asyncio.create_task(run_group(group)))
            if rate != math.inf:
                await asyncio.sleep(rng.expovariate(rate))
        results = [r for rs in await asyncio.gather(*tasks) for r in rs]
    return results, time.perf_counter() - start


def _arrival_groups(reqs: list[Request]) -> list[list[Request]]:
    """Requests that arrive on their own are groups of one; a conversation's turns, in order,
    are one group."""
    groups: dict[object, list[Request]] = {}
    for i, r in enumerate(reqs):
        groups.setdefault(("c", r.conversation) if r.conversation >= 0 else i, []).append(r)
    return [sorted(g, key=lambda r: r.turn) for g in groups.values()]


# -- report -------------------------------------------------------------------------------
COLUMNS = [
    "workload",
    "server",
    "requests",
    "duration s",
    "req/s",
    "output tok/s",
    "TTFT ms p50/p95/p99",
    "TPOT ms p50/p95/p99",
    "ITL ms p50/p95/p99",
    "cache hit",
]


def _num(x: float, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def table_row(workload: str, server: str, s: dict) -> list[str]:
    trio = [" / ".join(_num(v, 0) for v in s[k]) for k in ("ttft_ms", "tpot_ms", "itl_ms")]
    failed = f" ({s['failed']} failed)" if s["failed"] else ""
    return [
        workload,
        server,
        f"{s['completed']}{failed}",
        _num(s["duration_s"]),
        _num(s["request_throughput"], 2),
        _num(s["output_throughput"]),
        *trio,
        _num(100 * s["cache_hit_rate"]) + "%",
    ]


def ratio_row(workload: str, on: dict, off: dict) -> list[str]:
    """on / off for every figure: above 1 is faster for throughput, below 1 for latency."""

    def r(a: float, b: float) -> str:
        return _num(a / b, 2) + "x" if b and not math.isnan(a / b) else "-"

    trio = [
        " / ".join(r(a, b) for a, b in zip(on[k], off[k], strict=True))
        for k in ("ttft_ms", "tpot_ms", "itl_ms")
    ]
    return [
        workload,
        "ratio on/off",
        "",
        r(on["duration_s"], off["duration_s"]),
        r(on["request_throughput"], off["request_throughput"]),
        r(on["output_throughput"], off["output_throughput"]),
        *trio,
        "",
    ]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# -- main ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--model", default=None, help="default: the first of GET /v1/models")
    p.add_argument("--api-key", default=None)
    p.add_argument("--workload", default="all", help=f"{', '.join(WORKLOADS)}, a comma list or all")
    p.add_argument(
        "--num-requests", type=int, default=None, help=f"per workload; default: {DEFAULT_REQUESTS}"
    )
    p.add_argument(
        "--request-rate",
        default="inf",
        help="requests/s, or a comma list of rates run one after another; inf: all at once",
    )
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--output-len", type=int, default=32, help="shared-prefix and multi-turn")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    p.add_argument("--output-json", default=None)
    p.add_argument("--plot", default=None, help="also draw the table into this PNG file")
    launch.add_args(p)
    args = p.parse_args(argv)
    names = WORKLOADS if args.workload == "all" else tuple(args.workload.split(","))
    bad = sorted(set(names) - set(WORKLOADS))
    if bad:
        p.error(f"--workload: unknown {bad}; allowed: {list(WORKLOADS)} or all")
    args.workloads = names
    try:
        args.request_rates = [float(r) for r in args.request_rate.split(",")]
    except ValueError:
        p.error(f"--request-rate: numbers or inf, comma-separated; got {args.request_rate!r}")
    if any(not r > 0 for r in args.request_rates):
        p.error(f"--request-rate: each rate must be > 0; got {args.request_rate!r}")
    args.request_rate = args.request_rates[0]
    return args


def runs_of(args: argparse.Namespace) -> list[tuple[str, str, float]]:
    """(table key, workload, rate) for every workload at every rate; with one rate the key is
    the workload's name, else "name @ rate/s"."""
    several = len(args.request_rates) > 1
    return [
        (f"{name} @ {rate:g}/s" if several else name, name, rate)
        for name in args.workloads
        for rate in args.request_rates
    ]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_server(args: argparse.Namespace, base_url: str, label: str) -> dict[str, dict]:
    """Every chosen workload against one server, the cache flushed before each."""
    model = args.model or launch.first_model(base_url, args.api_key)
    launch.warm_up(base_url, model, args.api_key)
    out = {}
    for key, name, rate in runs_of(args):
        reqs = build_workload(
            name,
            args.num_requests or DEFAULT_REQUESTS[name],
            args.seed,
            args.output_len,
            args.turns,
        )
        launch.flush_cache(base_url, args.api_key)
        log(f"[{label}] {name}: {len(reqs)} requests at rate {rate}")
        results, duration = asyncio.run(
            run_workload(
                base_url,
                model,
                reqs,
                rate,
                args.seed,
                args.max_concurrency,
                args.timeout,
                launch.headers(args.api_key),
            )
        )
        failures = [r.error for r in results if not r.ok]
        if failures:
            log(f"[{label}] {name}: {len(failures)} failed, first: {failures[0]}")
        out[key] = summarize(results, duration)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs: dict[str, dict[str, dict]] = {}
    if args.compare_radix_cache:
        for label, extra in (
            ("radix cache on", []),
            ("radix cache off", ["--disable-radix-cache"]),
        ):
            with launch.launched(args, extra) as url:
                runs[label] = bench_server(args, url, label)
    elif args.launch:
        with launch.launched(args, []) as url:
            runs["radixrt"] = bench_server(args, url, "radixrt")
    else:
        runs[args.base_url] = bench_server(args, args.base_url, args.base_url)
    rows = []
    for key, _, _ in runs_of(args):
        rows += [table_row(key, label, run[key]) for label, run in runs.items()]
        if args.compare_radix_cache:
            rows.append(ratio_row(key, *(run[key] for run in runs.values())))
    print(markdown(rows))
    if args.plot:
        from bench_plots import plot_serving

        plot_serving(runs, args.plot, "python " + shlex.join(sys.argv))
        log(f"plot written to {args.plot}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(
                {"args": {k: v for k, v in vars(args).items() if k != "workloads"}, "runs": runs},
                f,
                indent=2,
                default=str,
            )


if __name__ == "__main__":
    main()
