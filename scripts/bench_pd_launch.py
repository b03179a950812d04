"""Process plumbing for scripts/bench_pd.py: radixrt servers pinned to cores with taskset,
SMG in its prefill/decode mode in front of two of them, their counters and their logs.

Every child starts in its own session, so a Ctrl-C at the terminal reaches only the
benchmark, which then stops them in order (gateway first): SIGTERM (SIGINT for SMG), then
SIGKILL to the child's whole process group if it has not exited within the wait.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import bench_serving_launch as launch
import httpx
from bench_dp import _all_workers_healthy

STOP_WAIT_S = 60.0
# Lines of a child's log worth showing after the run: its warnings and errors, tracebacks,
# aborted requests and failed or timed-out transfers. uvicorn's logger is named "error" even
# for its INFO lines; SMG warns at every start that it runs without authentication.
LEVELS = re.compile(r"\b(WARN|WARNING|ERROR|CRITICAL)\b|Traceback")
EVENTS = re.compile(r"abort|fail|timed out", re.IGNORECASE)
NOISE = re.compile(r"uvicorn\.error|SECURITY POSTURE|\x1b\[[0-9;]*m")


@dataclass
class Child:
    name: str
    cmd: list[str]
    proc: subprocess.Popen
    log: str
    url: str


def _spawn(name: str, cmd: list[str], log_dir: str, url: str) -> Child:
    log = os.path.join(log_dir, f"{name}.log")
    print(f"[{name}] {shlex.join(cmd)}  (log: {log})", file=sys.stderr, flush=True)
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return Child(name, cmd, proc, log, url)


def stop(child: Child, sig: int = signal.SIGTERM) -> None:
    """`sig`, then SIGKILL to the child's process group (its scheduler and detokenizer too)
    if it lingers past STOP_WAIT_S."""
    if child.proc.poll() is None:
        child.proc.send_signal(sig)
        try:
            child.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            print(f"[{child.name}] did not stop; killing it", file=sys.stderr, flush=True)
    # A launcher that exited cleanly has reaped its children; one that was killed may not.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, signal.SIGKILL)
    child.proc.wait()


def server_cmd(cpus: str, threads: int, port: int, flags: list[str]) -> list[str]:
    return [
        *("taskset", "-c", cpus, sys.executable, "-m", "radixrt.cli", "launch"),
        *("--port", str(port), "--num-threads", str(threads), *flags),
    ]


@contextlib.contextmanager
def servers(
    specs: list[tuple[str, list[str]]], timeout: float, log_dir: str
) -> Iterator[list[Child]]:
    """Start every (name, command) at once (the command's --port is its URL's), wait until
    all are healthy, yield them; stop them all at the end or on error."""
    children: list[Child] = []
    try:
        for name, cmd in specs:
            port = cmd[cmd.index("--port") + 1]
            children.append(_spawn(name, cmd, log_dir, f"http://127.0.0.1:{port}"))
        for c in children:
            launch._wait_healthy(c.proc, c.url, timeout, c.log)
        yield children
    finally:
        for c in reversed(children):
            stop(c)


@contextlib.contextmanager
def pd_gateway(
    smg: str, prefill: Child, bootstrap: int, decode: Child, log_dir: str
) -> Iterator[Child]:
    """`smg launch --pd-disaggregation` on a free port, once it lists both workers healthy."""
    port, metrics = launch._free_port(), launch._free_port()
    cmd = [smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--pd-disaggregation"]
    cmd += ["--prefill", prefill.url, str(bootstrap), "--decode", decode.url]
    cmd += ["--prometheus-port", str(metrics), "--log-level", "warn"]
    child = _spawn("smg", cmd, log_dir, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 120
        while not _all_workers_healthy(child.url, 2, None):
            if child.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"smg did not register both workers; its log:\n{tail(child)}")
            time.sleep(0.5)
        yield child
    finally:
        stop(child, signal.SIGINT)


def new_log_dir() -> str:
    return tempfile.mkdtemp(prefix="bench-pd-")


def tail(child: Child, lines: int = 30) -> str:
    return launch._tail(child.log, lines)


def notable_lines(child: Child, limit: int = 8) -> tuple[int, list[str]]:
    """How many lines of the child's log look like trouble, and the first `limit` of them."""
    with open(child.log, errors="replace") as f:
        lines = (NOISE.sub("", line).rstrip() for line in f if "SECURITY POSTURE" not in line)
        hits = [line for line in lines if LEVELS.search(line) or EVENTS.search(line)]
    return len(hits), hits[:limit]


def server_info(url: str) -> dict:
    resp = httpx.get(f"{url}/server_info", timeout=30)
    resp.raise_for_status()
    return resp.json()


def counters(url: str) -> dict[str, float]:
    """The numeric counters of /server_info that a run moves (transfers, tokens)."""
    info = server_info(url)
    keys = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens")
    return {
        k: v
        for k, v in info.items()
        if (k.startswith("disagg_") or k in keys) and isinstance(v, int | float)
    }


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0) for k, v in after.items()}


def cpu_header() -> str:
    """The CPU's model name and the vector flags that decide which kernels run."""
    model, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags |= set(line.split(":", 1)[1].split())
    wanted = ("amx_tile", "avx2", "avx512_bf16", "avx512_vnni", "avx512f")
    return f"{model}, {os.cpu_count()} CPUs; flags: {' '.join(f for f in wanted if f in flags)}"


def cpu_seconds(children: list[Child]) -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, of the children's process groups and this
    benchmark): the difference of two calls says how much of the cores someone else took."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:9]]  # user .. steal (guest is in user)
    machine = (sum(t) - t[3] - t[4]) / tick  # not idle, not iowait
    groups, ours = {c.proc.pid for c in children}, 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # from the state field on
            if int(fields[2]) in groups:
                ours += int(fields[11]) + int(fields[12])  # utime + stime
    me = os.times()
    return machine, ours / tick + me.user + me.system
