"""How many threads a CPU step runs on: all of torch's, or one when that is faster now.

OpenMP threads wait for each other at the end of every parallel region (a decode step has ~150
of them). When another process holds a core, the thread that shares it is descheduled for a
whole time slice and its partner spins: a batch-1 decode step on this project's 2-core machine
went from 22 ms to 160-1300 ms with 2 threads, and to 35-46 ms with 1 (cpu_kernels.md: Threads).
Which is faster depends on the load of the moment, so each step size is timed with both:
steps mostly run on the count that has been faster lately, and the other is tried again now
and then, less and less often while it keeps losing (an exploration that costs at most a few
percent even when the loser is 30x slower), and at once when the count in use becomes slower
than the other was.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_RETRY = 16  # steps before a slower thread count is tried again; doubles on each loss
MAX_RETRY = 1024
SMOOTHING = 0.25  # weight of the newest step time in the running average


@dataclass
class _SizeClass:
    """One step size: the running-average step time of the count in use, the last time of the
    other one (a retry is judged on its own time: the load that made it lose may be gone)."""

    seconds: dict[int, float | None]
    current: int
    steps_to_retry: int = 0  # 0: try the other count at the next step
    retry_after: int = FIRST_RETRY


class StepThreads:
    """Chooses the thread count per step; `record` gets each step's forward time.

    Steps are grouped by their new-token count, rounded down to a power of two: a batch-1
    decode and a 2,000-token chunk are timed apart. With one thread available it always
    answers 1 and keeps nothing."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max(1, max_threads)
        self._classes: dict[int, _SizeClass] = {}

    def choose(self, tokens: int) -> int:
        if self.max_threads == 1:
            return 1
        c = self._class(tokens)
        if c.steps_to_retry == 0 or None in c.seconds.values():
            return self._other(c.current)
        return c.current

    def record(self, tokens: int, threads: int, seconds: float) -> None:
        if self.max_threads == 1:
            return
        c = self._class(tokens)
        if threads != c.current:  # a retry of the other count (or its first run)
            c.seconds[threads] = seconds
            self._settle(c, threads, seconds)
            return
        old = c.seconds[threads]
        now = c.seconds[threads] = seconds if old is None else old + SMOOTHING * (seconds - old)
        other = c.seconds[self._other(threads)]
        # Slower now than the other count was when last tried: the load changed, retry it.
        c.steps_to_retry = 0 if other is not None and now > other else max(0, c.steps_to_retry - 1)

    def _settle(self, c: _SizeClass, tried: int, seconds: float) -> None:
        current = c.seconds[c.current]
        if current is None or seconds < current:
            c.current, c.retry_after = tried, FIRST_RETRY  # it won: switch, retry soon
        else:
            c.retry_after = min(2 * c.retry_after, MAX_RETRY)  # it lost again: back off
        c.steps_to_retry = c.retry_after

    def _other(self, threads: int) -> int:
        return 1 if threads == self.max_threads else self.max_threads

    def _class(self, tokens: int) -> _SizeClass:
        key = max(1, tokens).bit_length()
        c = self._classes.get(key)
        if c is None:
            seconds: dict[int, float | None] = {1: None, self.max_threads: None}
            c = self._classes[key] = _SizeClass(seconds, current=self.max_threads)
        return c
