"""`@function`: a program, and how it runs (run, run_batch, bind, trace)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from radixrt.lang.backends.base import Backend
from radixrt.lang.default_backend import resolve_backend
from radixrt.lang.executor import ProgramLog, StreamExecutor, summarize
from radixrt.lang.state import ProgramState
from radixrt.lang.tracer import Placeholder, ProgramIR, trace

# run(...)'s sampling defaults, as SGLang's; a gen's own arguments win over them.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
    "presence_penalty": 0.0, "ignore_eos": False, "seed": None, "return_logprob": False,
    "logprob_start_len": None, "top_logprobs_num": None}
MIN_SHARED_PREFIX_CHARS = 16  # shorter common text is not worth a request of its own


class Function:
    """A program: `func(s, *args)` appends to the state s. Options of `function(...)` are
    sampling defaults for its runs (e.g. temperature=0)."""

    def __init__(self, func: Callable, bind_arguments: dict[str, Any] | None = None,
                 defaults: dict[str, Any] | None = None) -> None:
        self.func = func
        self.bind_arguments = bind_arguments or {}
        self.defaults = _check_defaults(defaults or {})
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(f"{func.__name__}: a program's first parameter is its state (s)")
        self.arg_names = params[1:]

    def bind(self, **kwargs: Any) -> "Function":
        """The same program with some arguments fixed."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.func.__name__}.bind: unknown arguments {sorted(unknown)}; "
                            f"it takes {self.arg_names}")
        return Function(self.func, {**self.bind_arguments, **kwargs}, self.defaults)

    def __call__(self, state: ProgramState, *args: Any, **kwargs: Any) -> Any:
        """Run inside another program, on its state: `my_subprogram(s, x=1)`."""
        return self.func(state, *args, **{**self.bind_arguments, **kwargs})

    def run(self, *args: Any, stream: bool = False, backend: Any = None,
            **kwargs: Any) -> ProgramState:
        """Run once. kwargs are the program's arguments and sampling defaults
        (max_new_tokens=128, temperature=1.0, stop, top_p, ...: see SAMPLING_DEFAULTS). Returns
        when it is done (with stream=True at once: iterate with state.text_iter()); raises
        the program's error."""
        arguments, defaults = self._split(args, kwargs)
        return run_program(self.func, resolve_backend(backend), arguments, defaults, stream,
                           raise_error=True)

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  **defaults: Any) -> "BatchResult":
        """Run once per dict of arguments, num_threads at a time; states in input order. A
        failed program's state raises its error when read. The text all the programs start
        with is prefilled once first."""
        backend = resolve_backend(backend)
        _check_defaults(defaults)
        runs = [self._split((), {**kw, **defaults}) for kw in _check_batch(batch_kwargs)]
        prefix_metas = self._cache_common_prefix(backend, [a for a, _ in runs])
        workers = _thread_count(num_threads, len(runs))
        states: list[ProgramState | None] = [None] * len(runs)
        bar = _progress(len(runs)) if progress_bar else None
        with ThreadPoolExecutor(workers, thread_name_prefix="radixrt-batch") as pool:
            futures = {pool.submit(run_program, self.func, backend, a, d, False, False): i
                       for i, (a, d) in enumerate(runs)}
            for future in as_completed(futures):
                states[futures[future]] = future.result()
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return BatchResult(states, prefix_metas)

    def trace(self, **kwargs: Any) -> ProgramIR:
        """The program's IR; arguments not given (and without a default) are placeholders
        like "{docs}"."""
        params = inspect.signature(self.func).parameters
        arguments = {name: Placeholder("{" + name + "}") for name in self.arg_names
                     if params[name].default is inspect.Parameter.empty
                     and params[name].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                   inspect.Parameter.VAR_KEYWORD)}
        arguments.update(self.bind_arguments)
        arguments.update(kwargs)
        return trace(self.func, self.func.__name__, arguments)

    def _split(self, args: tuple, kwargs: dict[str, Any]) -> tuple[dict, dict]:
        """(program arguments, sampling defaults) out of run's arguments."""
        defaults = {**SAMPLING_DEFAULTS, **self.defaults}
        for key in list(kwargs):
            if key in SAMPLING_DEFAULTS and key not in self.arg_names:
                defaults[key] = kwargs.pop(key)
        if len(args) > len(self.arg_names):
            raise TypeError(f"{self.func.__name__}() takes {len(self.arg_names)} arguments, "
                            f"got {len(args)}")
        arguments = {**self.bind_arguments, **dict(zip(self.arg_names, args)), **kwargs}
        try:
            inspect.signature(self.func).bind(None, **arguments)
        except TypeError as exc:
            unknown = sorted(set(arguments) - set(self.arg_names))
            why = f"unexpected arguments {unknown}" if unknown else str(exc)
            raise TypeError(f"{self.func.__name__}(): {why}; it takes {self.arg_names} and "
                            f"the sampling defaults {list(SAMPLING_DEFAULTS)}") from None
        return arguments, {k: v for k, v in defaults.items() if v is not None}

    def _cache_common_prefix(self, backend: Backend, runs: list[dict]) -> list[dict]:
        """Trace each program up to its first generation; prefill their common text once."""
        if len(runs) < 2:
            return []
        template = backend.get_chat_template()
        texts = []
        for arguments in runs:
            try:
                texts.append(trace(self.func, "", arguments, prefix_only=True)
                             .leading_text(template))
            except Exception:  # the real run reports it; tracing is only a hint
                return []
        prefix = os.path.commonprefix(texts)
        if len(prefix) < MIN_SHARED_PREFIX_CHARS:
            return []
        return [backend.cache_prefix(prefix)]


def run_program(func: Callable, backend: Backend, arguments: dict[str, Any],
                defaults: dict[str, Any], stream: bool, raise_error: bool) -> ProgramState:
    executor = StreamExecutor(backend, backend.get_chat_template(), defaults, stream,
                              ProgramLog())
    state = ProgramState(executor)
    try:
        state.ret_value = func(state, **arguments)
    except BaseException as exc:
        executor.fail(exc)
        executor.end(wait=True)
        if raise_error:
            raise
        return state
    executor.end(wait=not stream)
    if raise_error and not stream:
        state.sync()
    return state


class BatchResult(list):
    """run_batch's states (a list), with the whole batch's meta info."""

    def __init__(self, states: list[ProgramState], prefix_metas: list[dict]) -> None:
        super().__init__(states)
        self.prefix_metas = prefix_metas

    def get_meta_info(self) -> dict[str, Any]:
        """Every request of the batch summed (the shared-prefix prefill included), with
        cache_hit_rate = cached_tokens / prompt_tokens."""
        requests = list(self.prefix_metas)
        for state in self:
            requests.extend(state.stream_executor.log.requests)
        return summarize(requests)

    @property
    def cache_hit_rate(self) -> float:
        return self.get_meta_info()["cache_hit_rate"]


def function(func: Callable | None = None, *, num_api_spec_tokens: int | None = None,
             **defaults: Any) -> Any:
    """`@function` or `@function(temperature=0, ...)`: make a program. num_api_spec_tokens is
    accepted for SGLang programs (it only matters to API backends; radixrt's ignore it)."""
    if func is not None:
        return Function(func, defaults=defaults)
    return lambda f: Function(f, defaults=defaults)


def _check_defaults(defaults: dict[str, Any]) -> dict[str, Any]:
    unknown = set(defaults) - set(SAMPLING_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown sampling defaults {sorted(unknown)}; allowed: "
                        f"{', '.join(SAMPLING_DEFAULTS)}")
    return defaults


def _check_batch(batch_kwargs: Any) -> list[dict[str, Any]]:
    if not isinstance(batch_kwargs, (list, tuple)) or not all(
            isinstance(kw, dict) for kw in batch_kwargs):
        raise TypeError("run_batch: batch_kwargs must be a list of dicts of arguments")
    return list(batch_kwargs)


def _thread_count(num_threads: int | str, jobs: int) -> int:
    if num_threads == "auto":
        return max(1, min(jobs, 64))
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"run_batch: num_threads must be 'auto' or an int >= 1, "
                         f"got {num_threads!r}")
    return num_threads


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="programs")
