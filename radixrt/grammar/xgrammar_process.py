"""xgrammar in a child process, for a process that cannot import torch (the HTTP server's).

xgrammar imports torch (its matcher's bitmasks are tensors, and tvm_ffi, its binding layer,
imports torch whenever it can), so a process that keeps torch out (the server's:
loader.tokenizer.keep_torch_out) parses and checks constraints here instead: one child per
such process, started at the first constraint, running the functions the in-process path runs
(constraint.parse_constraint, checker.verdict), so the answers and their messages are the same.

Requests and answers are JSON lines on the child's stdin and stdout (nothing is unpickled).
The child exits when its stdin closes, so it ends with its parent however that ends; if it
dies first, what was pending fails and the next request starts another child.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from radixrt.grammar.workers import DaemonExecutor, TimedFuture


def needed() -> bool:
    """Whether xgrammar must run in a child here: this process cannot import torch."""
    return importlib.util.find_spec("torch") is None


class XgrammarProcess:
    """The parent's end: `call` sends one request, its future gets the child's answer."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._lock = threading.Lock()
        self._pending: dict[int, TimedFuture] = {}
        self._ids = itertools.count()
        self.alive = True
        threading.Thread(target=self._read, daemon=True, name="radixrt-xgrammar-reader").start()

    def call(self, op: str, **fields: Any) -> TimedFuture:
        """A future of the child's answer to `op` (see _Child); its `started_at` is set when
        the child begins the work. RuntimeError through it if the child raised or died."""
        future = TimedFuture()
        future.set_running_or_notify_cancel()  # queued in the child: no longer cancellable
        with self._lock:
            if not self.alive:
                future.set_exception(RuntimeError("the xgrammar process has exited"))
                return future
            n = next(self._ids)
            self._pending[n] = future
            assert self._proc.stdin is not None  # stdin=PIPE
            # If it died, _read fails every pending future at its end of file.
            with contextlib.suppress(OSError):
                self._proc.stdin.write((json.dumps({"id": n, "op": op, **fields}) + "\n").encode())
                self._proc.stdin.flush()
        return future

    def close(self) -> None:
        """End the child (it exits when its stdin closes; killed if it does not at once)."""
        assert self._proc.stdin is not None  # stdin=PIPE
        with self._lock, contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _read(self) -> None:
        assert self._proc.stdout is not None  # stdout=PIPE
        for line in self._proc.stdout:
            answer = json.loads(line)
            with self._lock:
                future = self._pending.get(answer["id"])
                if future is not None and "started" not in answer:
                    del self._pending[answer["id"]]
            if future is None:
                continue
            if "started" in answer:
                future.started_at = time.monotonic()
            elif "error" in answer:
                future.set_exception(RuntimeError(answer["error"]))
            else:
                future.set_result(answer["result"])
        code = self._proc.wait()
        with self._lock:
            self.alive = False
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(RuntimeError(f"the xgrammar process exited with status {code}"))


_shared: XgrammarProcess | None = None
_shared_lock = threading.Lock()


def shared() -> XgrammarProcess:
    """This process's xgrammar child, started now if there is none or it died."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.alive:
            _shared = XgrammarProcess()
        return _shared


class _Child:
    """The child's end. Requests (JSON objects with "id" and "op"):
    - vocabulary {key, folder, vocab_size}: load the tokenizer saved in `folder` and make a
      compiler for it under `key`; answered with null.
    - check {key, kind, text, vocab_size, any_whitespace}: checker.verdict with that
      compiler: null or the ParamError message.
    - parse {kind, text}: null, or the ParamError message of constraint.parse_constraint.
    - forget {key}: drop a compiler; not answered.
    Each answer is preceded by {"id", "started": true} when a worker takes the request."""

    def __init__(self, answers: IO[str]) -> None:
        from radixrt.grammar.checker import WORKERS  # as many compiles at once as in-process

        self._answers = answers
        self._lock = threading.Lock()
        self._pool = DaemonExecutor(WORKERS, "radixrt-xgrammar")
        self._setup = DaemonExecutor(1, "radixrt-xgrammar-setup")  # never behind a compile
        self._compilers: dict[int, tuple[Any, Any]] = {}

    def handle(self, request: dict[str, Any]) -> None:
        op = request["op"]
        if op == "forget":
            self._compilers.pop(request["key"], None)
        elif op == "vocabulary":
            self._setup.submit(self._answer, request, self._vocabulary)
        else:
            self._pool.submit(self._answer, request, self._check if op == "check" else _parse)

    def _answer(self, request: dict[str, Any], work: Any) -> None:
        self._send({"id": request["id"], "started": True})
        try:
            answer: dict[str, Any] = {"result": work(request)}
        except Exception as e:  # noqa: BLE001 - the parent raises it as a RuntimeError
            answer = {"error": f"{type(e).__name__}: {e}"}
        self._send({"id": request["id"], **answer})

    def _send(self, answer: dict[str, Any]) -> None:
        with self._lock:
            self._answers.write(json.dumps(answer) + "\n")
            self._answers.flush()

    def _vocabulary(self, request: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        from radixrt.grammar.backend import make_compiler

        tokenizer = AutoTokenizer.from_pretrained(request["folder"])
        self._compilers[request["key"]] = make_compiler(tokenizer, request["vocab_size"])

    def _check(self, request: dict[str, Any]) -> str | None:
        from radixrt.grammar.checker import verdict

        xgr, compiler = self._compilers[request["key"]]
        fields = ("kind", "text", "vocab_size", "any_whitespace")
        return verdict(xgr, compiler, *(request[f] for f in fields))


def _parse(request: dict[str, Any]) -> str | None:
    import xgrammar as xgr

    from radixrt.errors import ParamError
    from radixrt.grammar.constraint import parse_constraint

    try:
        parse_constraint(xgr, request["kind"], request["text"])
    except ParamError as e:
        return str(e)
    return None


def main() -> None:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a library's print must not corrupt the answers
    for sig in (signal.SIGINT, signal.SIGTERM):  # a terminal's Ctrl-C: the parent ends this
        signal.signal(sig, signal.SIG_IGN)
    child = _Child(answers)
    for line in sys.stdin:
        child.handle(json.loads(line))
    os._exit(0)  # the parent is gone or done: compiles still running die with this process


if __name__ == "__main__":
    main()
