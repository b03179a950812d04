"""The frontend's check of a constraint before its request is queued: it parses, compiles
within --grammar-compile-timeout, and some token of the vocabulary can start its text.

A constraint no token can start (a regex of a control character no token spells) is a 400
naming the field here, instead of a request that could only fail in the scheduler. A compile
that runs past the timeout is a 400 too, and its text is remembered: the next request with it
is answered at once instead of starting another compile (xgrammar's cannot be interrupted;
the worker finishes it in the background). Verdicts are cached by a hash of the text, so the
cache stays small whatever the texts weigh.

Where xgrammar runs: on this process's threads, or, in a process that cannot import torch
(xgrammar imports it; the HTTP server keeps it out), in that process's xgrammar child
(xgrammar_process.py). Both run `verdict`, so the answers are the same.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from radixrt.errors import GrammarBusy, ParamError
from radixrt.grammar import xgrammar_process
from radixrt.grammar.backend import allows_some_token, make_compiler
from radixrt.grammar.constraint import check_constraint_size, parse_constraint
from radixrt.grammar.workers import DaemonExecutor

CACHE_SIZE = 1024
WORKERS = 2  # compiles at once: one slow constraint does not hold up every other
SETUP_TIMEOUT_S = 120.0  # reading the vocabulary once; not the request's compile time


class ConstraintChecker:
    def __init__(
        self, tokenizer: Any, vocab_size: int, timeout_s: float, json_any_whitespace: bool = False
    ) -> None:
        self.timeout_s = timeout_s
        where = _InChild if xgrammar_process.needed() else _InThreads
        self._runner = where(tokenizer, vocab_size, json_any_whitespace)
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[bytes, Future] = OrderedDict()

    def check(self, kind: str, text: str) -> None:
        """Returns if the constraint is usable; ParamError naming `kind` if not (or if
        it did not compile within the timeout); GrammarBusy if it could not be tried."""
        check_constraint_size(kind, text)  # cheap: before any thread or hash
        self._runner.ready(SETUP_TIMEOUT_S)
        future = self._verdict(kind, text)
        deadline = time.monotonic() + self.timeout_s
        try:
            message = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            message = self._timed_out(kind, text, future, deadline)
        if message is not None:
            raise ParamError(kind, message)

    def close(self) -> None:
        self._runner.close()

    def _verdict(self, kind: str, text: str) -> Future:
        """The (cached) future of the check's message: None when the constraint is fine."""
        key = _key(kind, text)
        with self._lock:
            future = self._verdicts.get(key)
            if future is None or future.cancelled() or _failed(future):
                future = self._runner.submit(kind, text)
                self._verdicts[key] = future
                if len(self._verdicts) > CACHE_SIZE:
                    self._verdicts.popitem(last=False)
            self._verdicts.move_to_end(key)
            return future

    def _timed_out(self, kind: str, text: str, future: Future, deadline: float) -> str:
        started = getattr(future, "started_at", None)
        if started is None or started > deadline - self.timeout_s / 2:
            # It waited behind other compiles most of the time: not its own fault.
            raise GrammarBusy(
                f"the grammar compiler is busy with other constraints: {kind!r} "
                f"could not be checked within {self.timeout_s:g} s; retry later"
            )
        message = (
            f"sampling param {kind!r} did not compile within {self.timeout_s:g} s (the "
            "server's --grammar-compile-timeout): simplify it"
        )
        done: Future = Future()
        done.set_result(message)
        with self._lock:
            self._verdicts[_key(kind, text)] = done  # answered at once from now on
        return message


def _key(kind: str, text: str) -> bytes:
    return hashlib.sha256(f"{kind}\0{text}".encode(errors="surrogatepass")).digest()


def _failed(future: Future) -> bool:
    """A check that raised (not a verdict): try it again next time."""
    return future.done() and future.exception() is not None


def verdict(
    xgr: Any, compiler: Any, kind: str, text: str, vocab_size: int, any_whitespace: bool
) -> str | None:
    """None if the constraint compiles and some token can start it, else why not (the
    message of the ParamError that names `kind`)."""
    try:
        compiled = compiler.compile_grammar(parse_constraint(xgr, kind, text, any_whitespace))
    except ParamError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - xgrammar's compiler refused what it parsed
        return f"sampling param {kind!r} did not compile: {e}"
    if not allows_some_token(xgr, compiled, vocab_size):
        return (
            f"sampling param {kind!r} can never be satisfied: no token of this "
            f"model's vocabulary can start a text it accepts (it cannot be empty and "
            "its first character is not in any token)"
        )
    return None


class _InThreads:
    """xgrammar on this process's worker threads."""

    def __init__(self, tokenizer: Any, vocab_size: int, any_whitespace: bool) -> None:
        self._args = (vocab_size, any_whitespace)
        self._pool = DaemonExecutor(WORKERS, "radixrt-grammar-check")
        self._setup = self._pool.submit(make_compiler, tokenizer, vocab_size)

    def ready(self, timeout_s: float) -> None:
        self._setup.result(timeout=timeout_s)

    def submit(self, kind: str, text: str) -> Future:
        return self._pool.submit(self._run, kind, text)

    def close(self) -> None:
        self._pool.shutdown()

    def _run(self, kind: str, text: str) -> str | None:
        xgr, compiler = self._setup.result()
        return verdict(xgr, compiler, kind, text, *self._args)


_KEYS = itertools.count()  # one compiler in the shared child per _InChild


class _InChild:
    """xgrammar in this process's xgrammar child, with a copy of the tokenizer (saved to a
    temporary folder for it to load); registered again in a new child if the last one died."""

    def __init__(self, tokenizer: Any, vocab_size: int, any_whitespace: bool) -> None:
        self._tokenizer = tokenizer
        self._fields = {"vocab_size": vocab_size, "any_whitespace": any_whitespace}
        self._key = next(_KEYS)
        self._lock = threading.Lock()
        self._child: xgrammar_process.XgrammarProcess | None = None
        self._setup: Future = Future()

    def ready(self, timeout_s: float) -> None:
        with self._lock:
            child = xgrammar_process.shared()
            if child is not self._child:  # the first check, or the last child died
                self._child, self._setup = child, self._register(child)
            setup = self._setup
        setup.result(timeout=timeout_s)

    def submit(self, kind: str, text: str) -> Future:
        assert self._child is not None, "check() waits for ready() first"
        return self._child.call("check", key=self._key, kind=kind, text=text, **self._fields)

    def close(self) -> None:
        if self._child is not None and self._child.alive:
            self._child.call("forget", key=self._key)

    def _register(self, child: xgrammar_process.XgrammarProcess) -> Future:
        folder = tempfile.mkdtemp(prefix="radixrt-vocabulary-")
        self._tokenizer.save_pretrained(folder)
        vocab_size = self._fields["vocab_size"]
        future = child.call("vocabulary", key=self._key, folder=folder, vocab_size=vocab_size)
        future.add_done_callback(lambda _: shutil.rmtree(folder, ignore_errors=True))
        return future
