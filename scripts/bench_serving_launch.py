"""Server plumbing for scripts/bench_serving.py: start and stop `radixrt launch`, find the
model name, warm up, flush the prefix cache between workloads."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--launch",
        action="store_true",
        help="start `radixrt launch` on a free port, bench it, stop it",
    )
    p.add_argument(
        "--compare-radix-cache",
        action="store_true",
        help="launch twice, with the radix cache on then off; one table",
    )
    p.add_argument(
        "--server-args",
        default="",
        help="extra `radixrt launch` flags, one string, e.g. "
        '"--max-total-tokens 60000 --dtype bfloat16"',
    )
    p.add_argument(
        "--launch-timeout", type=float, default=600.0, help="seconds to wait for /health"
    )


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched(args: argparse.Namespace, extra: list[str]) -> Iterator[str]:
    """A `radixrt launch` child on a free port, healthy; yields its base URL. Its output goes
    to a log file (the table owns stdout); SIGTERM at the end, SIGKILL if it lingers."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "radixrt.cli",
        "launch",
        "--port",
        str(port),
        *shlex.split(args.server_args),
        *extra,
    ]
    if args.api_key:
        cmd += ["--api-key", args.api_key]
    log_path = os.path.join(tempfile.mkdtemp(prefix="bench-serving-"), "server.log")
    print(f"launching: {shlex.join(cmd)}  (log: {log_path})", file=sys.stderr, flush=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, url, args.launch_timeout, log_path)
        yield url
    finally:
        _stop(proc)


def _wait_healthy(proc: subprocess.Popen, url: str, timeout: float, log_path: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the server exited with code {proc.returncode} before it was "
                f"healthy; its log ends:\n{_tail(log_path)}"
            )
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(
        f"the server was not healthy after {timeout:.0f} s; its log ends:\n{_tail(log_path)}"
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(path: str, lines: int = 20) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def first_model(base_url: str, api_key: str | None) -> str:
    resp = httpx.get(f"{base_url}/v1/models", headers=headers(api_key), timeout=30)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def warm_up(base_url: str, model: str, api_key: str | None) -> None:
    """Two short requests, so that first-call costs stay out of the measurements."""
    body = {"model": model, "prompt": "Warm up: count to three.", "max_tokens": 4}
    for _ in range(2):
        httpx.post(
            f"{base_url}/v1/completions", json=body, headers=headers(api_key), timeout=300
        ).raise_for_status()


def flush_cache(base_url: str, api_key: str | None) -> None:
    """Empty the prefix cache (radixrt and SGLang have /flush_cache; others may not). It is
    refused while requests run: the last one of a workload may still be finishing."""
    for _ in range(20):
        try:
            resp = httpx.post(f"{base_url}/flush_cache", headers=headers(api_key), timeout=30)
        except httpx.HTTPError:
            return
        if resp.status_code in (200, 404, 405):
            return
        time.sleep(0.25)
