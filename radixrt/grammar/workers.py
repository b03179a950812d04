"""A small thread pool of daemon threads for grammar work.

Why not ThreadPoolExecutor: its threads are joined at interpreter exit, so one compile of a
pathological grammar (xgrammar cannot be interrupted) would hold up the exit of the process
that started it. Here a process exits at once; the compile dies with it. Each future records
when its task started (`started_at`), so a caller can tell "slow" from "not begun yet".
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class TimedFuture(Future[Any]):
    """A Future that says when its task started (None: still queued)."""

    started_at: float | None = None


class DaemonExecutor:
    def __init__(self, workers: int, name: str) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        for i in range(workers):
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> TimedFuture:
        """A future of fn(*args), run in order of submission; `future.started_at` is None
        until a worker takes it, then its time.monotonic()."""
        future = TimedFuture()
        self._tasks.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """Workers stop after their current task; queued tasks are cancelled."""
        self._closed = True
        while True:
            try:
                future, _, _ = self._tasks.get_nowait()
            except queue.Empty:
                break
            future.cancel()
        self._tasks.put(None)

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, fn, args = task
            if self._closed or not future.set_running_or_notify_cancel():
                future.cancel()
                continue
            future.started_at = time.monotonic()
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - the caller sees it through the future
                future.set_exception(e)
        self._tasks.put(None)  # wake the next worker, so that every one stops
