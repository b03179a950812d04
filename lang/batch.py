"""`run_batch`'s machinery: its argument forms, its thread pool, and its two result styles."""

from __future__ import annotations

import inspect
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

# generator_style submits this many programs ahead of the one it waits for (as SGLang does), so
# a huge batch does not queue every program before the first state is yielded.
GENERATOR_WINDOW = 200

Runner = Callable[[dict[str, Any], dict[str, Any]], Any]  # (arguments, defaults) -> state


class ProgramBatch:
    """Runs `runner` once per (arguments, defaults) pair on `workers` threads."""

    def __init__(
        self, runner: Runner, runs: list[tuple[dict, dict]], workers: int, progress_bar: bool
    ) -> None:
        self.runner = runner
        self.runs = runs
        self.workers = workers
        self.progress_bar = progress_bar

    def run_all(self) -> list[Any]:
        """Every state, in input order, once all have finished."""
        return list(self.iterate())

    def iterate(self) -> Iterator[Any]:
        """Each state in input order, as soon as it (and those before it) finished."""
        bar = _progress(len(self.runs)) if self.progress_bar else None
        with ThreadPoolExecutor(max(self.workers, 1), thread_name_prefix="radixrt-batch") as pool:
            pending: list[Future] = []
            for arguments, defaults in self.runs:
                pending.append(self._submit(pool, arguments, defaults, bar))
                if len(pending) > GENERATOR_WINDOW:
                    yield pending.pop(0).result()
            for future in pending:
                yield future.result()
        if bar is not None:
            bar.close()

    def _submit(
        self, pool: ThreadPoolExecutor, arguments: dict, defaults: dict, bar: Any
    ) -> Future:
        future = pool.submit(self.runner, arguments, defaults)
        if bar is not None:
            future.add_done_callback(lambda _: bar.update(1))
        return future


def batch_arguments(batch_kwargs: Any, func: Callable, arg_names: list[str]) -> list[dict]:
    """run_batch's items as dicts of arguments: a dict as it is, a list or tuple as the
    program's arguments in order (as SGLang's)."""
    if not isinstance(batch_kwargs, (list, tuple)):
        raise TypeError(
            "run_batch: batch_kwargs must be a list of dicts of arguments (or of "
            "lists of them in the program's order)"
        )
    params = inspect.signature(func).parameters
    required = sum(1 for n in arg_names if params[n].default is inspect.Parameter.empty)
    out = []
    for i, item in enumerate(batch_kwargs):
        if isinstance(item, dict):
            out.append(item)
        elif isinstance(item, (list, tuple)) and required <= len(item) <= len(arg_names):
            out.append(dict(zip(arg_names, item, strict=False)))  # trailing defaults omitted
        else:
            raise TypeError(
                f"run_batch: item {i} must be a dict of arguments or a list of "
                f"{required} to {len(arg_names)} values for {arg_names}; got "
                f"{item!r}"
            )
    return out


def thread_count(num_threads: int | str, jobs: int) -> int:
    if num_threads == "auto":
        return max(1, min(jobs, max(96, multiprocessing.cpu_count() * 16)))
    if not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 1:
        raise ValueError(
            f"run_batch: num_threads must be 'auto' or an int >= 1, got {num_threads!r}"
        )
    return max(1, min(num_threads, jobs))


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="programs")
