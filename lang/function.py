"""`@function`: a program, and how it runs (run, run_batch, bind, trace)."""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from radixrt.lang.backends.base import Backend
from radixrt.lang.batch import ProgramBatch, batch_arguments, thread_count
from radixrt.lang.default_backend import resolve_backend
from radixrt.lang.executor import ProgramLog, StreamExecutor, summarize
from radixrt.lang.global_config import global_config
from radixrt.lang.state import Appending, ProgramState
from radixrt.lang.tracer import Placeholder, ProgramIR, trace

# run(...)'s sampling defaults, as SGLang's; a gen's own arguments win over them.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "n": 1,
    "stop": None,
    "stop_token_ids": None,
    "stop_regex": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": False,
    "seed": None,
    "return_logprob": False,
    "logprob_start_len": None,
    "top_logprobs_num": None,
    "return_text_in_logprobs": None,
}
MIN_SHARED_PREFIX_CHARS = 16  # shorter common text is not worth a request of its own


class Function:
    """A program: `func(s, *args)` appends to the state s. Options of `function(...)` are
    sampling defaults for its runs (e.g. temperature=0)."""

    def __init__(
        self,
        func: Callable,
        bind_arguments: dict[str, Any] | None = None,
        defaults: dict[str, Any] | None = None,
        num_api_spec_tokens: int | None = None,
    ) -> None:
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = bind_arguments or {}
        self.defaults = _check_defaults(defaults or {})
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(f"{func.__name__}: a program's first parameter is its state (s)")
        self.arg_names = params[1:]

    def bind(self, **kwargs: Any) -> Function:
        """The same program with some arguments fixed."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(
                f"{self.func.__name__}.bind: unknown arguments {sorted(unknown)}; "
                f"it takes {self.arg_names}"
            )
        return Function(
            self.func, {**self.bind_arguments, **kwargs}, self.defaults, self.num_api_spec_tokens
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inside a program, `sub(s, x=1)` runs the body on that program's state s; anywhere
        else `f(x=1, temperature=0)` is `f.run(x=1, temperature=0)`, as SGLang's."""
        if args and isinstance(args[0], Appending):  # a ProgramState or a tracer's state
            return self.func(args[0], *args[1:], **{**self.bind_arguments, **kwargs})
        return self.run(*args, **kwargs)

    def run(
        self,
        *args: Any,
        stream: bool = False,
        backend: Any = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run once. kwargs are the program's arguments and sampling defaults
        (max_new_tokens=128, n=1, temperature=1.0, stop, stop_regex, top_p, ...: see
        SAMPLING_DEFAULTS). Returns when it is done (with stream=True at once: iterate with
        state.text_iter()); raises the program's error. use_thread is accepted for SGLang
        programs: a program's expressions always run on a thread of their own here."""
        arguments, defaults = self._split(args, kwargs)
        return run_program(
            self.func,
            resolve_backend(backend),
            arguments,
            defaults,
            stream,
            raise_error=True,
            spec_tokens=self.num_api_spec_tokens,
        )

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]] | list[list | tuple],
        *,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        **defaults: Any,
    ) -> BatchResult | Iterator[ProgramState]:
        """Run once per item of batch_kwargs (a dict of arguments, or a list of them in the
        program's order), num_threads at a time ("auto": as SGLang, up to max(96, 16 per
        CPU)); defaults are the sampling defaults, as run's. Returns the states in input
        order; with generator_style=True, an iterator that yields each state, in input order,
        as soon as it has finished. A failed program's state raises its error when read. With
        global_config.enable_precache_with_tracing, the text all the programs start with is
        prefilled once first."""
        backend = resolve_backend(backend)
        _check_defaults(defaults)
        runs = [
            self._split((), {**kw, **defaults})
            for kw in batch_arguments(batch_kwargs, self.func, self.arg_names)
        ]
        prefix_metas = []
        if global_config.enable_precache_with_tracing:
            prefix_metas = self._cache_common_prefix(backend, [a for a, _ in runs])
        runner = functools.partial(_run_in_batch, self.func, backend, self.num_api_spec_tokens)
        batch = ProgramBatch(runner, runs, thread_count(num_threads, len(runs)), progress_bar)
        if generator_style:
            return batch.iterate()
        return BatchResult(batch.run_all(), prefix_metas)

    def trace(self, *, backend: Any = None, **kwargs: Any) -> ProgramIR:
        """The program's IR; arguments not given (and without a default) are placeholders
        like "{docs}". backend is accepted for SGLang programs (tracing needs none)."""
        params = inspect.signature(self.func).parameters
        arguments = {
            name: Placeholder("{" + name + "}")
            for name in self.arg_names
            if params[name].default is inspect.Parameter.empty
            and params[name].kind
            not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        }
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
            raise TypeError(
                f"{self.func.__name__}() takes {len(self.arg_names)} arguments, got {len(args)}"
            )
        # Fewer positional arguments than parameters is fine: the rest come from kwargs.
        positional = dict(zip(self.arg_names, args, strict=False))
        arguments = {**self.bind_arguments, **positional, **kwargs}
        try:
            inspect.signature(self.func).bind(None, **arguments)
        except TypeError as exc:
            unknown = sorted(set(arguments) - set(self.arg_names))
            why = f"unexpected arguments {unknown}" if unknown else str(exc)
            raise TypeError(
                f"{self.func.__name__}(): {why}; it takes {self.arg_names} and "
                f"the sampling defaults {list(SAMPLING_DEFAULTS)}"
            ) from None
        return arguments, {k: v for k, v in defaults.items() if v is not None}

    def _cache_common_prefix(self, backend: Backend, runs: list[dict]) -> list[dict]:
        """Trace each program up to its first generation; prefill their common text once."""
        if len(runs) < 2:
            return []
        template = backend.get_chat_template()
        texts = []
        for arguments in runs:
            try:
                texts.append(
                    trace(self.func, "", arguments, prefix_only=True).leading_text(template)
                )
            except Exception:  # the real run reports it; tracing is only a hint
                return []
        prefix = os.path.commonprefix(texts)
        if len(prefix) < MIN_SHARED_PREFIX_CHARS:
            return []
        return [backend.cache_prefix(prefix)]


def run_program(
    func: Callable,
    backend: Backend,
    arguments: dict[str, Any],
    defaults: dict[str, Any],
    stream: bool,
    raise_error: bool,
    spec_tokens: int | None = None,
) -> ProgramState:
    executor = StreamExecutor(
        backend, backend.get_chat_template(), defaults, stream, ProgramLog(), spec_tokens
    )
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
    if global_config.verbosity >= 2:
        _print_when_done(state, stream)
    return state


def _run_in_batch(
    func: Callable,
    backend: Backend,
    spec_tokens: int | None,
    arguments: dict[str, Any],
    defaults: dict[str, Any],
) -> ProgramState:
    return run_program(
        func, backend, arguments, defaults, stream=False, raise_error=False, spec_tokens=spec_tokens
    )


def _print_when_done(state: ProgramState, stream: bool) -> None:
    """verbosity 2: the program's final text (after a stream too, once it has ended)."""

    def show() -> None:
        try:
            print(state.text())
        except Exception as exc:  # noqa: BLE001 - the program's error, read where it is used
            print(f"(program failed: {exc!r})")

    if stream:
        threading.Thread(target=show, daemon=True, name="radixrt-verbose").start()
    else:
        show()


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


def function(
    func: Callable | None = None, *, num_api_spec_tokens: int | None = None, **defaults: Any
) -> Any:
    """`@function` or `@function(temperature=0, ...)`: make a program. num_api_spec_tokens
    turns on SGLang's API speculative execution (radixrt.lang.speculative)."""
    if func is not None:
        return Function(func, defaults=defaults, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: Function(f, defaults=defaults, num_api_spec_tokens=num_api_spec_tokens)


def _check_defaults(defaults: dict[str, Any]) -> dict[str, Any]:
    unknown = set(defaults) - set(SAMPLING_DEFAULTS)
    if unknown:
        raise TypeError(
            f"unknown sampling defaults {sorted(unknown)}; allowed: {', '.join(SAMPLING_DEFAULTS)}"
        )
    return defaults
