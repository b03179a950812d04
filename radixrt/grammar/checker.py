"""The frontend's check of a constraint before its request is queued: it parses, compiles
within --grammar-compile-timeout, and some token of the vocabulary can start its text.

A constraint no token can start (a regex of a control character no token spells) is a 400
naming the field here, instead of a request that could only fail in the scheduler. A compile
that runs past the timeout is a 400 too, and its text is remembered: the next request with it
is answered at once instead of starting another compile (xgrammar's cannot be interrupted;
the worker finishes it in the background). Verdicts are cached by a hash of the text, so the
cache stays small whatever the texts weigh.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from radixrt.errors import GrammarBusy, ParamError
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
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.json_any_whitespace = json_any_whitespace
        self._pool = DaemonExecutor(WORKERS, "radixrt-grammar-check")
        self._setup = self._pool.submit(make_compiler, tokenizer, vocab_size)
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[bytes, Future] = OrderedDict()

    def check(self, kind: str, text: str) -> None:
        """Returns if the constraint is usable; ParamError naming `kind` if not (or if
        it did not compile within the timeout); GrammarBusy if it could not be tried."""
        check_constraint_size(kind, text)  # cheap: before any thread or hash
        self._setup.result(timeout=SETUP_TIMEOUT_S)
        future = self._verdict(kind, text)
        deadline = time.monotonic() + self.timeout_s
        try:
            message = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            message = self._timed_out(kind, text, future, deadline)
        if message is not None:
            raise ParamError(kind, message)

    def close(self) -> None:
        self._pool.shutdown()

    def _verdict(self, kind: str, text: str) -> Future:
        """The (cached) future of the check's message: None when the constraint is fine."""
        key = _key(kind, text)
        with self._lock:
            future = self._verdicts.get(key)
            if future is None or future.cancelled() or _failed(future):
                future = self._pool.submit(self._run, kind, text)
                self._verdicts[key] = future
                if len(self._verdicts) > CACHE_SIZE:
                    self._verdicts.popitem(last=False)
            self._verdicts.move_to_end(key)
            return future

    def _run(self, kind: str, text: str) -> str | None:
        xgr, compiler = self._setup.result()
        try:
            compiled = compiler.compile_grammar(
                parse_constraint(xgr, kind, text, self.json_any_whitespace)
            )
        except ParamError as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 - xgrammar's compiler refused what it parsed
            return f"sampling param {kind!r} did not compile: {e}"
        if not allows_some_token(xgr, compiled, self.vocab_size):
            return (
                f"sampling param {kind!r} can never be satisfied: no token of this "
                f"model's vocabulary can start a text it accepts (it cannot be empty and "
                "its first character is not in any token)"
            )
        return None

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
