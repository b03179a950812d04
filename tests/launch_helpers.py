"""Start `radixrt launch` as a real subprocess on a free loopback port (server and DSL tests)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

STARTUP_TIMEOUT_S = 180


@dataclass
class LaunchedServer:
    proc: subprocess.Popen
    url: str
    log: Path
    api_key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> list[int]:
        """Pids of the server's child processes (scheduler and detokenizer)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _stop_with_pytest() -> None:
    """In the server: SIGTERM when pytest dies (a killed test run must not leave servers)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def fresh_python_lines(code: str, timeout_s: float = 300) -> list[str]:
    """What `code` prints, run by a fresh interpreter: its imports are its own, not pytest's."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=True
    )
    return out.stdout.strip().splitlines()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(count: int) -> int:
    """The first of `count` consecutive loopback ports that are free now, below the kernel's
    ephemeral range: a port from that range can be taken by any outgoing connection's local
    end between this check and the server's bind (seen once in CI with --dp-size)."""
    ephemeral_low = _ephemeral_port_low()
    for _ in range(200):
        first = random.randrange(10_000, ephemeral_low - count)
        if all(_bindable(port) for port in range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports below {ephemeral_low}")


def _ephemeral_port_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    """Whether the server could bind it: the same socket options as launch's own check."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def tiny_server_flags(model_dir: str, max_total_tokens: int = 2048) -> list[str]:
    """The flags of a quick test server: a tiny random-weight model in fp32, a small pool."""
    return [
        "--model-path",
        model_dir,
        "--dtype",
        "float32",
        "--max-total-tokens",
        str(max_total_tokens),
    ]


def launch(tmp_dir: Path, *args: str, api_key: str | None = None) -> LaunchedServer:
    """Start `radixrt launch` with `args` and wait for /health; fail with its log if not."""
    port = free_port()
    log = tmp_dir / f"server-{port}.log"
    cmd = [sys.executable, "-m", "radixrt.cli", "launch", "--port", str(port), *args]
    if api_key:
        cmd += ["--api-key", api_key]
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_stop_with_pytest,
        )
    server = LaunchedServer(proc, f"http://127.0.0.1:{port}", log, api_key)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"radixrt launch exited with {proc.returncode}:\n{server.log_text()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    pytest.fail(f"radixrt launch did not become healthy:\n{server.log_text()}")


@pytest.fixture(scope="module")
def launch_server(tmp_path_factory):
    """Factory `(*cli_args, api_key=None) -> LaunchedServer`; servers stop at module end.
    A fixture: conftest files import it to offer it."""
    servers: list[LaunchedServer] = []

    def start(*args: str, api_key: str | None = None) -> LaunchedServer:
        server = launch(tmp_path_factory.mktemp("server"), *args, api_key=api_key)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def server_stats(server: LaunchedServer) -> dict:
    """/server_info: the scheduler's counters (running, queued, free and evictable tokens)."""
    r = httpx.get(server.url + "/server_info", headers=server.headers, timeout=30)
    r.raise_for_status()
    return r.json()


def assert_pool_conserved(server: LaunchedServer, timeout_s: float = 30) -> None:
    """Once the server is idle, no request holds a token: free + cached == the pool, and the
    server still answers /health."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = server_stats(server)
        idle = info["running"] == 0 and info["queued"] == 0 and info["grammar_queue"] == 0
        held = info["max_total_num_tokens"] - info["free_tokens"] - info["evictable_tokens"]
        if idle and held == 0:
            break
        assert time.monotonic() < deadline, f"requests still hold KV after {timeout_s} s: {info}"
        time.sleep(0.2)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
