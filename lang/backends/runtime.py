"""`Runtime(**engine_args)`: start a local `radixrt launch` server and use it as a backend."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from radixrt.lang.backends.runtime_endpoint import RuntimeEndpoint


class Runtime(RuntimeEndpoint):
    """Every ServerArgs field is a keyword (model_path, disable_radix_cache, log_level, ...;
    the default model when model_path is None). The server is a child process on a free
    loopback port, stopped by `shutdown()` or when this process exits. As SGLang's Runtime it
    has `.url` and `.endpoint` (itself: it is the RuntimeEndpoint); launch_timeout is SGLang's
    name for startup_timeout_s. transport is RuntimeEndpoint's."""

    def __init__(
        self,
        model_path: str | None = None,
        *,
        startup_timeout_s: float = 300,
        launch_timeout: float | None = None,
        transport: str = "auto",
        **engine_args: Any,
    ) -> None:
        startup_timeout_s = launch_timeout if launch_timeout is not None else startup_timeout_s
        self.process = None
        port = engine_args.pop("port", None) or _free_port()
        host = engine_args.get("host", "127.0.0.1")
        cmd = [
            sys.executable,
            "-m",
            "radixrt.cli",
            "launch",
            "--port",
            str(port),
            *_flags(model_path=model_path, **engine_args),
        ]
        with tempfile.NamedTemporaryFile(
            prefix="radixrt-runtime-", suffix=".log", delete=False
        ) as named:
            self.log_path = named.name
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=_stop_with_parent,
            )
        atexit.register(self.shutdown)
        self.url = f"http://{host}:{port}"
        try:
            self._wait_healthy(startup_timeout_s)
            super().__init__(self.url, api_key=engine_args.get("api_key"), transport=transport)
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """Close the connections and stop the server (SIGTERM: it stops its children in
        order). Safe to call twice."""
        atexit.unregister(self.shutdown)
        if getattr(self, "http", None) is not None:
            super().shutdown()
            self.http = None
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.returncode == 0 and os.path.exists(self.log_path):
            os.unlink(self.log_path)  # kept when the server failed: the place to look

    close = shutdown

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"radixrt launch exited with {self.process.returncode}:\n{_tail(self.log_path)}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(
            f"radixrt launch was not healthy within {timeout_s} s:\n{_tail(self.log_path)}"
        )


def _stop_with_parent() -> None:
    """In the child: on Linux, get SIGTERM when the process that started the server dies
    without calling shutdown (a kill -9 skips atexit). Elsewhere, atexit only."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _flags(**engine_args: Any) -> list[str]:
    flags = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, lines: int = 40) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])
