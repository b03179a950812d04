"""Data parallelism behind SGLang's model gateway: two radixrt replicas (`radixrt launch
--dp-size 2`) behind SMG's cache_aware policy, against the same replicas behind SMG's
round_robin, in one run, on a multi-turn chat workload whose conversations share a few long
system prompts.

    python scripts/bench_dp.py --model-path /path/to/model --conversations 32 --turns 3
    python scripts/bench_dp.py --server-args "--max-total-tokens 200000" --output-json dp.json

Reported per policy (scripts/bench_serving.py's table and statistics): request and output
token throughput, TTFT / TPOT / ITL p50/p95/p99, and the cache hit rate (sum of
usage.prompt_tokens_details.cached_tokens / sum of prompt tokens); then the ratios
cache_aware / round_robin. Both gateways front the same two replicas; the replicas' prefix
caches are flushed before each policy's run, so each starts cold. The split of requests
between the replicas (their /server_info counters) goes to stderr and --output-json.

On a machine with several CUDA devices each replica takes its own; on one device the two share
it (give --server-args "--max-total-tokens N" so that both KV pools fit). Needs `smg` on PATH
or beside this Python (`pip install smg`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import bench_serving_launch as launch
import httpx
from bench_serving import markdown, ratio_row, run_workload, summarize, table_row
from bench_serving_workloads import FILLER, TOPICS, Request, _user_turn

POLICIES = ("cache_aware", "round_robin")
# SMG's warm-up diversions (a share of cache hits sent to a cold worker on purpose) are left
# at SMG's defaults: the comparison is of the policies as deployed.
SMG_FLAGS = ("--health-check-interval-secs", "5", "--log-level", "warn")


def shared_system_multi_turn(
    conversations: int, turns: int, systems: int, system_words: int, output_len: int, seed: int
) -> list[Request]:
    """`conversations` chats of `turns` turns; conversation c opens with system prompt
    c % systems (each ~system_words words of local text) and a user turn."""
    rng = random.Random(seed)
    sentences = [f"{s} Topic {t}." for s in FILLER for t in TOPICS]
    prompts = []
    for i in range(systems):
        words: list[str] = [f"Assistant profile {i}:"]
        while len(words) < system_words:
            words += rng.choice(sentences).split()
        prompts.append(" ".join(words[:system_words]))
    out = []
    for c in range(conversations):
        topic = TOPICS[c % len(TOPICS)]
        system = {"role": "system", "content": prompts[c % systems]}
        for t in range(turns):
            user = {"role": "user", "content": _user_turn(rng, topic)}
            messages = [system, user] if t == 0 else [user]
            out.append(Request(output_len, messages=messages, conversation=c, turn=t))
    return out


def _consecutive_free_ports(n: int) -> int:
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n <= 65535 and all(_port_free(first + i) for i in range(n)):
            return first
    raise RuntimeError(f"found no {n} consecutive free ports")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_healthy(urls: list[str], proc: subprocess.Popen, timeout: float, log: str) -> None:
    deadline = time.monotonic() + timeout
    pending = list(urls)
    while pending:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = Path(log).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"not healthy: {pending} (exit {proc.poll()}); log ends:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(pending[0] + "/health", timeout=2).status_code == 200:
                pending.pop(0)
                continue
        time.sleep(0.5)


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def replicas(args: argparse.Namespace) -> Iterator[list[str]]:
    """`radixrt launch --dp-size N` on consecutive free ports; yields the replicas' URLs."""
    port = _consecutive_free_ports(args.dp_size)
    cmd = [sys.executable, "-m", "radixrt.cli", "launch", "--dp-size", str(args.dp_size)]
    cmd += ["--port", str(port), *shlex.split(args.server_args)]
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    log = os.path.join(tempfile.mkdtemp(prefix="bench-dp-"), "replicas.log")
    print(f"launching: {shlex.join(cmd)}  (log: {log})", file=sys.stderr, flush=True)
    env = {**os.environ, **({"RADIXRT_API_KEY": args.api_key} if args.api_key else {})}
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        urls = [f"http://127.0.0.1:{port + i}" for i in range(args.dp_size)]
        _wait_healthy(urls, proc, args.launch_timeout, log)
        yield urls
    finally:
        _stop(proc)


@contextlib.contextmanager
def gateway(smg: str, policy: str, urls: list[str], api_key: str | None) -> Iterator[str]:
    """`smg launch --policy POLICY --worker-urls ...` on a free port, once it lists every
    worker healthy; yields its URL."""
    port, metrics_port = _consecutive_free_ports(1), _consecutive_free_ports(1)
    cmd = [smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy]
    cmd += ["--prometheus-port", str(metrics_port), *SMG_FLAGS, "--worker-urls", *urls]
    if api_key:
        cmd += ["--api-key", api_key]
    log = os.path.join(tempfile.mkdtemp(prefix=f"bench-dp-smg-{policy}-"), "smg.log")
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _all_workers_healthy(url, len(urls), api_key):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"smg ({policy}) did not come up; see {log}")
            time.sleep(0.5)
        yield url
    finally:
        _stop(proc, signal.SIGINT)


def _all_workers_healthy(url: str, n: int, api_key: str | None) -> bool:
    try:
        r = httpx.get(url + "/workers", headers=launch.headers(api_key), timeout=5)
        workers = r.json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return len(workers) == n and all(w.get("is_healthy") for w in workers)


def request_counts(urls: list[str], api_key: str | None) -> list[int]:
    """Requests each replica's scheduler has taken in (/server_info)."""
    hdrs = launch.headers(api_key)
    infos = [httpx.get(u + "/server_info", headers=hdrs, timeout=30).json() for u in urls]
    return [info["requests"] for info in infos]


def bench_policy(args: argparse.Namespace, smg: str, policy: str, urls: list[str]) -> dict:
    reqs = shared_system_multi_turn(
        args.conversations, args.turns, args.systems, args.system_words, args.output_len, args.seed
    )
    model = launch.first_model(urls[0], args.api_key)
    for url in urls:
        launch.flush_cache(url, args.api_key)
    before = request_counts(urls, args.api_key)
    with gateway(smg, policy, urls, args.api_key) as url:
        print(f"[{policy}] {len(reqs)} requests via {url}", file=sys.stderr, flush=True)
        results, duration = asyncio.run(
            run_workload(
                url,
                model,
                reqs,
                args.request_rate,
                args.seed,
                args.max_concurrency,
                args.timeout,
                launch.headers(args.api_key),
            )
        )
    split = [a - b for a, b in zip(request_counts(urls, args.api_key), before, strict=True)]
    failures = [r.error for r in results if not r.ok]
    if failures:
        print(f"[{policy}] {len(failures)} failed, first: {failures[0]}", file=sys.stderr)
    print(f"[{policy}] requests per replica: {split}", file=sys.stderr, flush=True)
    return {**summarize(results, duration), "requests_per_replica": split}


def policy_rows(runs: dict[str, dict]) -> list[list[str]]:
    aware, spread = runs["cache_aware"], runs["round_robin"]
    rows = [table_row("multi-turn, shared system", p, s) for p, s in runs.items()]
    ratio = ratio_row("multi-turn, shared system", aware, spread)
    ratio[1] = "ratio cache_aware / round_robin"
    hits = aware["cache_hit_rate"] / spread["cache_hit_rate"] if spread["cache_hit_rate"] else 0
    ratio[-1] = f"{hits:.2f}x" if hits and not math.isnan(hits) else "-"
    return rows + [ratio]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=None, help="default: radixrt's default model")
    p.add_argument("--server-args", default="", help="extra `radixrt launch` flags, one string")
    p.add_argument("--dp-size", type=int, default=2, help="replicas behind the gateway")
    p.add_argument("--api-key", default=None, help="the replicas' and the gateway's key")
    p.add_argument("--conversations", type=int, default=32)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--systems", type=int, default=4, help="distinct system prompts")
    p.add_argument("--system-words", type=int, default=300, help="words per system prompt")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--request-rate", type=float, default=math.inf, help="conversations/s")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    p.add_argument("--launch-timeout", type=float, default=600.0)
    p.add_argument("--smg", default=None, help="the smg executable; default: found on PATH")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    args.smg = args.smg or shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
    if not Path(args.smg).exists():
        p.error(f"--smg: no smg executable at {args.smg} (pip install smg)")
    if args.dp_size < 2 or min(args.conversations, args.turns, args.systems) < 1:
        p.error("--dp-size must be >= 2; --conversations, --turns, --systems >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with replicas(args) as urls:
        model = launch.first_model(urls[0], args.api_key)
        for url in urls:
            launch.warm_up(url, model, args.api_key)
        runs = {policy: bench_policy(args, args.smg, policy, urls) for policy in POLICIES}
    print(markdown(policy_rows(runs)))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=2, default=str)


if __name__ == "__main__":
    main()
