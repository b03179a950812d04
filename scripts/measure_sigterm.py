"""How long `radixrt launch` takes to stop on SIGTERM with streams running, and what the
clients got: prints, per run, the seconds from the signal until each process is gone and until
the last client saw `data: [DONE]`, the exit status, and how many streams ended with an error
event then [DONE].

    .venv/bin/python scripts/measure_sigterm.py --runs 3            # the default model
    .venv/bin/python scripts/measure_sigterm.py --streams 32 --server-args "--log-level info"

The streams are /v1/chat/completions and /generate in turn, each asking for more tokens than
it will get before the signal."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

PROMPT = "Write a very long story about a lighthouse keeper."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


class Stream(threading.Thread):
    """One streaming request; records its `data:` payloads and when the last one came."""

    def __init__(self, url: str, index: int, max_tokens: int, started: threading.Semaphore):
        super().__init__(daemon=True)
        self.url, self.index, self.max_tokens, self.started = url, index, max_tokens, started
        self.events: list[str] = []
        self.last_at = 0.0
        self.error: str | None = None

    def run(self) -> None:
        if self.index % 2:
            path = "/generate"
            body: dict = {
                "text": PROMPT,
                "stream": True,
                "sampling_params": {"max_new_tokens": self.max_tokens, "ignore_eos": True},
            }
        else:
            path = "/v1/chat/completions"
            body = {
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": self.max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        try:
            with httpx.stream("POST", self.url + path, json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        if not self.events:
                            self.started.release()
                        self.events.append(line[6:])
                        self.last_at = time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported in the summary
            self.error = repr(e)
        if not self.events:
            self.started.release()

    def ended_with_error(self) -> bool:
        if self.error or len(self.events) < 2 or self.events[-1] != "[DONE]":
            return False
        return "error" in json.loads(self.events[-2])


def launch(extra: list[str], log_path: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "radixrt.cli", "launch", "--port", str(port), *extra]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited during start-up: see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become healthy in 600 s")


def one_run(args: argparse.Namespace) -> dict:
    log_path = tempfile.mktemp(prefix="radixrt-sigterm-", suffix=".log")
    proc, url = launch(shlex.split(args.server_args), log_path)
    pids = {"main": proc.pid}
    scheduler = httpx.get(url + "/get_server_info", timeout=30).json()["scheduler_pid"]
    for child in _children(proc.pid):
        pids["scheduler" if child == scheduler else "detokenizer"] = child
    started = threading.Semaphore(0)
    streams = [Stream(url, i, args.max_tokens, started) for i in range(args.streams)]
    for s in streams:
        s.start()
    for _ in streams:
        started.acquire(timeout=300)
    time.sleep(args.settle)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    gone: dict[str, float] = {}
    while len(gone) < len(pids) and time.monotonic() - t0 < 60:
        for name, pid in pids.items():
            if name not in gone and (
                proc.poll() is not None if name == "main" else not _alive(pid)
            ):
                gone[name] = time.monotonic() - t0
        time.sleep(0.005)
    rc = proc.wait(timeout=60)
    for s in streams:
        s.join(timeout=30)
    done_at = [s.last_at - t0 for s in streams if s.events and s.events[-1] == "[DONE]"]
    result = {
        "all_gone_s": max(gone.values()),
        **{f"{k}_gone_s": round(v, 3) for k, v in gone.items()},
        "last_done_s": round(max(done_at), 3) if done_at else None,
        "rc": rc,
        "t0": round(t0, 3),
        "error_then_done": sum(s.ended_with_error() for s in streams),
        "streams": len(streams),
        "log": log_path,
    }
    if args.keep_log is False:
        os.unlink(log_path)
        del result["log"]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--settle", type=float, default=1.0, help="seconds of streaming before")
    p.add_argument("--server-args", default="", help="extra `radixrt launch` flags, one string")
    p.add_argument("--keep-log", action="store_true", help="keep the server's log file")
    args = p.parse_args()
    figures = []
    for i in range(args.runs):
        r = one_run(args)
        figures.append(r["all_gone_s"])
        print(json.dumps({"run": i + 1, **{k: v for k, v in r.items()}}), flush=True)
    print(f"all three processes gone after SIGTERM: {min(figures):.2f}-{max(figures):.2f} s")


if __name__ == "__main__":
    main()
