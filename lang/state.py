"""What a program sees as `s`: append with `+=`, read variables, fork, iterate over text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from radixrt.lang import ir
from radixrt.lang.executor import StreamExecutor


class Appending:
    """Roles and variable scopes, built on `self += expr` (shared with the tracer)."""

    def role(self, name: str, expr: Any = None):
        """With expr, append name's turn around it; without, a context manager:
        `with s.user(): s += ...`."""
        if expr is not None:
            self += ir.role(name, expr)
            return None
        return self._role_scope(name)

    @contextmanager
    def _role_scope(self, name: str) -> Iterator[None]:
        self += ir.RoleBegin(name)
        yield
        self += ir.RoleEnd(name)

    def system(self, expr: Any = None):
        return self.role("system", expr)

    def user(self, expr: Any = None):
        return self.role("user", expr)

    def assistant(self, expr: Any = None):
        return self.role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """The text appended inside the block becomes variable `name`."""
        self += ir.VarScopeBegin(name)
        yield
        self += ir.VarScopeEnd(name)


class ProgramState(Appending):
    def __init__(self, executor: StreamExecutor) -> None:
        self.stream_executor = executor
        self.ret_value: Any = None  # what the program function returned

    # -- building -------------------------------------------------------------------------
    def __iadd__(self, other: Any) -> ProgramState:
        if other is None:
            raise ValueError("cannot append None to a program state")
        self.stream_executor.submit(ir.to_expr(other))
        return self

    def fork(self, size: int = 1) -> ProgramStateGroup:
        """`size` branches that continue from here, each on its own thread; the text so far is
        prefilled once (when size > 1) so the branches share it through the radix cache."""
        return ProgramStateGroup([ProgramState(e) for e in self.stream_executor.fork(size)], self)

    def copy(self) -> ProgramState:
        """An independent continuation of this state. Also SGLang's form, a context manager:
        `with s.copy() as c: ...` joins c's new variables back into s at the end."""
        group = self.fork(1)
        group[0]._copied_from = group
        return group[0]

    def __enter__(self) -> ProgramState:
        return self

    def __exit__(self, *exc: Any) -> None:
        group = getattr(self, "_copied_from", None)
        if group is not None and exc[0] is None:
            group.join()

    # -- reading ----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.stream_executor.sync()
        return name in self.stream_executor.variables

    def get_var(self, name: str) -> Any:
        """Wait for variable `name`; KeyError if the program ends without producing it."""
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def text(self) -> str:
        self.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, str]]:
        """The chat turns so far, as {"role", "content"} dicts."""
        self.sync()
        return list(self.stream_executor.messages_)

    def get_meta_info(self, name: str | None = None) -> Any:
        """The runtime's meta_info for the call that produced `name` (prompt_tokens,
        completion_tokens, cached_tokens, finish_reason, ...; a list when n > 1; select's
        scores). Without a name: the whole program's requests summed, with cache_hit_rate."""
        if name is None:
            self.sync()
            return self.stream_executor.log.summary()
        self.get_var(name)
        return self.stream_executor.meta_info.get(name)

    @property
    def cache_hit_rate(self) -> float:
        return self.get_meta_info()["cache_hit_rate"]

    def sync(self) -> None:
        """Wait for everything appended so far; raise the program's error if it failed."""
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        return self.stream_executor.error

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """The text (or one variable's) piece by piece as it is generated (run(stream=True));
        after the program ended, all of it."""
        return self.stream_executor.iter_chunks(var_name)

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """text_iter for asyncio. With return_meta_data (and a var_name), (text, meta_info)
        pairs as SGLang's: each pair's output_token_logprobs (and output_top_logprobs) are
        that chunk's new entries; completion_tokens and output_token_logprobs_length count
        from the start of the gen."""
        if return_meta_data and var_name is None:
            raise ValueError(
                "text_async_iter: return_meta_data needs a var_name (meta info belongs to one gen)"
            )
        chunks = self.stream_executor.iter_chunks(var_name, with_meta=return_meta_data)
        done = object()
        while (piece := await asyncio.to_thread(next, chunks, done)) is not done:
            yield piece

    def __repr__(self) -> str:  # the text so far, without waiting (a debugger calls this)
        return f"ProgramState({self.stream_executor.text_!r})"


class ProgramStateGroup:
    """The branches of a fork: `forks += expr` appends to each (a list: one item each)."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __setitem__(self, i: int, value: Any) -> None:
        """`forks[i] += expr` assigns the branch back to itself; nothing else may be put."""
        if value is not self.states[i]:
            raise TypeError(
                f"forks[{i}] = ...: a fork's branches cannot be replaced; append "
                f"to one with forks[{i}] += expr"
            )

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        """An expression or str goes to every branch; a list or tuple gives one item per
        branch; a callable is given each branch's index and returns what it gets."""
        if callable(other) and not isinstance(other, ir.Expr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(
                    f"forks += list: expected {len(self.states)} items (one per "
                    f"branch), got {len(other)}"
                )
            for state, item in zip(self.states, other, strict=True):
                state += item
        else:
            for state in self.states:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each variable the branches made becomes, in the parent, the list
        of its values. concate_and_append: the parent's text goes on with each branch's new
        text, in order."""
        for state in self.states:
            state.sync()
        parent = self.parent.stream_executor
        if mode == "gather_variable":
            parent.sync()
            # Variables a branch made or remade (not the ones it inherited untouched).
            names = {
                n
                for s in self.states
                for n, v in s.stream_executor.variables.items()
                if n not in parent.variables or v is not parent.variables[n]
            }
            for name in sorted(names):
                parent.set_var(name, [s.stream_executor.variables.get(name) for s in self.states])
                parent.meta_info[name] = [
                    s.stream_executor.meta_info.get(name) for s in self.states
                ]
        elif mode == "concate_and_append":
            self.parent += ir.ConcatAndAppend([s.stream_executor for s in self.states])
        else:
            raise ValueError(
                f"join: mode must be 'gather_variable' or 'concate_and_append', got {mode!r}"
            )
        for state in self.states:
            state.stream_executor.end()
