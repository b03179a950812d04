"""Runs a program state's expressions, in order, on a worker thread of its own.

`s += expr` queues and returns at once, so the Python body of a program runs ahead of the model
and forks run side by side; `s["x"]` waits for x. The thread starts with the first expression
and ends when the program ends (nothing stays alive after it). An exception on the thread is
kept and raised where the user looks: `s["x"]`, `text()`, `sync()`, `run`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from radixrt.lang import ir
from radixrt.lang.backends.base import Backend
from radixrt.lang.chat_template import ChatTemplate
from radixrt.lang.global_config import global_config
from radixrt.lang.reasoning import model_type_of, split_reasoning
from radixrt.lang.speculative import Speculation
from radixrt.lang.stream_meta import StreamMeta, merge_chunks, with_logprob_length

_END = object()
REQUEST_OPTIONS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)


class ProgramLog:
    """The meta_info of every request a program (its forks included) made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []

    def add(self, metas: list[dict[str, Any]]) -> None:
        with self._lock:
            self.requests.extend(metas)

    def summary(self) -> dict[str, Any]:
        return summarize(self.requests)


def summarize(requests: list[dict[str, Any]]) -> dict[str, Any]:
    prompt = sum(m.get("prompt_tokens", 0) for m in requests)
    cached = sum(m.get("cached_tokens", 0) for m in requests)
    return {
        "num_requests": len(requests),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": sum(m.get("completion_tokens", 0) for m in requests),
        "cache_hit_rate": cached / prompt if prompt else 0.0,
    }


class StreamExecutor:
    def __init__(
        self,
        backend: Backend,
        chat_template: ChatTemplate,
        defaults: dict[str, Any],
        stream: bool = False,
        log: ProgramLog | None = None,
        spec_tokens: int | None = None,
    ) -> None:
        self.backend = backend
        # num_api_spec_tokens (radixrt.lang.speculative); not inherited by forks, as SGLang's
        self.speculation = Speculation(spec_tokens) if spec_tokens and not stream else None
        self.chat_template = chat_template
        self.defaults = defaults  # sampling defaults from run(...); gen's own values win
        self.stream = stream
        self.log = log or ProgramLog()
        self.text_ = ""
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.messages_: list[dict[str, str]] = []
        self.cur_role: str | None = None
        self.role_start = 0
        self.scopes: dict[str, int] = {}
        self.fork_start = 0
        self.error: BaseException | None = None
        self.children: list[StreamExecutor] = []
        # (variable or None, text, that chunk's meta_info or None), as appended
        self.chunks: list[tuple[str | None, str, dict | None]] = []
        self._cond = threading.Condition()
        self._pending = 0
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._ended = False
        self._done = False

    # -- called from the user's thread ------------------------------------------------------
    def submit(self, expr: ir.Expr) -> None:
        if self._ended:
            raise RuntimeError("this program has ended; nothing more can be appended to it")
        with self._cond:
            self._pending += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, daemon=True, name="radixrt-program")
            self._thread.start()
        self._queue.put(expr)

    def sync(self) -> None:
        """Wait until every queued expression ran; raise the program's error if it failed."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)
        if self.error is not None:
            raise self.error

    def end(self, wait: bool = True) -> None:
        """No more expressions: the worker finishes what is queued and exits (forks too)."""
        for child in self.children:
            child.end(wait)
        if not self._ended:
            self._ended = True
            if self._thread is None:
                with self._cond:
                    self._done = True
                    self._cond.notify_all()
            else:
                self._queue.put(_END)
        if wait and self._thread is not None:
            self._thread.join()

    def fail(self, exc: BaseException) -> None:
        """The program failed (its body raised): skip what is still queued."""
        if self.error is None:
            self.error = exc

    def get_var(self, name: str) -> Any:
        with self._cond:
            self._cond.wait_for(lambda: name in self.variables or self._pending == 0)
            if name in self.variables:
                return self.variables[name]
        if self.error is not None:
            raise self.error
        known = ", ".join(sorted(self.variables)) or "none"
        raise KeyError(
            f"variable {name!r} was never produced by this program (its variables: {known})"
        )

    def set_var(self, name: str, value: Any) -> None:
        with self._cond:
            self.variables[name] = value
            self._cond.notify_all()

    def fork(self, n: int) -> list[StreamExecutor]:
        """n copies that continue from here; the text so far is prefilled once first, so
        every branch finds it in the radix cache."""
        if n < 1:
            raise ValueError(f"fork: n must be >= 1, got {n}")
        self.sync()
        if n > 1 and self.text_:
            self.log.add([self.backend.cache_prefix(self.text_)])
        children = [self._copy() for _ in range(n)]
        self.children.extend(children)
        return children

    def iter_chunks(self, var: str | None, with_meta: bool = False) -> Iterator[Any]:
        """The text as it is appended (only `var`'s, when given) until the program ends (or
        `var` is complete); with_meta: (text, that chunk's meta_info) pairs of `var`, a chunk
        without text merged into the next (as SGLang's)."""
        pos, pending = 0, None
        while True:
            with self._cond:
                self._cond.wait_for(lambda seen=pos: seen < len(self.chunks) or self._finished(var))
                new, pos = self.chunks[pos:], len(self.chunks)
                finished = self._finished(var) and pos == len(self.chunks)
            for name, text, meta in new:
                if var is not None and name != var:
                    continue
                if with_meta and meta is not None and not text:
                    pending = merge_chunks(pending, meta)
                elif with_meta and text:
                    yield text, merge_chunks(pending, meta or {})
                    pending = None
                elif text:
                    yield text
            if finished:
                if self.error is not None:
                    raise self.error
                return

    def _finished(self, var: str | None) -> bool:
        return self._done or self.error is not None or (var is not None and var in self.variables)

    def _copy(self) -> StreamExecutor:
        child = StreamExecutor(
            self.backend, self.chat_template, self.defaults, self.stream, self.log
        )
        child.text_ = self.text_
        child.variables = dict(self.variables)
        child.meta_info = dict(self.meta_info)
        child.messages_ = list(self.messages_)
        child.cur_role, child.role_start = self.cur_role, self.role_start
        child.fork_start = len(self.text_)
        return child

    # -- the worker thread --------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            expr = self._queue.get()
            if expr is _END:
                break
            try:
                if self.error is None:
                    self._execute(expr)
            except BaseException as exc:  # kept for the user's thread; see module docstring
                self.error = exc
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def _execute(self, expr: ir.Expr) -> None:
        if isinstance(expr, ir.ExprList):
            for item in expr.items:
                self._execute(item)
        elif isinstance(expr, ir.Text):
            self._fill(expr.value)
        elif isinstance(expr, ir.Gen):
            self._gen(expr)
        elif isinstance(expr, ir.Select):
            self._select(expr)
        elif isinstance(expr, ir.RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, ir.RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, ir.VarScopeBegin):
            self.scopes[expr.name] = len(self.text_)
        elif isinstance(expr, ir.VarScopeEnd):
            self.set_var(expr.name, self.text_[self.scopes.pop(expr.name) :])
        elif isinstance(expr, ir.SeparateReasoning):
            self._separate_reasoning(expr)
        elif isinstance(expr, ir.ConcatAndAppend):
            for fork in expr.forks:
                fork.sync()
                self._append(fork.text_[fork.fork_start :])
        else:
            raise TypeError(f"unknown expression {expr!r}")

    def _fill(self, text: str) -> None:
        """Constant text (the program's own, or a role's markers)."""
        if self.speculation is not None:
            self.speculation.on_fill(text)
        self._append(text)

    def _append(self, text: str, var: str | None = None, meta: dict | None = None) -> None:
        with self._cond:
            self.text_ += text
            self.chunks.append((var, text, meta))
            self._cond.notify_all()

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"cannot begin a {role} turn inside the {self.cur_role} turn")
        template = self.chat_template
        if not self.messages_ and role != "system":
            self._fill(template.default_system)
            if template.default_system_prompt is not None:
                self.messages_.append({"role": "system", "content": template.default_system_prompt})
        self._fill(template.begin(role))
        self.cur_role, self.role_start = role, len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.cur_role != role:
            raise ValueError(f"cannot end a {role} turn: the current turn is {self.cur_role}")
        self.messages_.append({"role": role, "content": self.text_[self.role_start :]})
        self.cur_role = None
        self._fill(self.chat_template.end(role))

    def _gen(self, expr: ir.Gen) -> None:
        params = self._sampling_params(expr)
        options = {k: params.pop(k) for k in REQUEST_OPTIONS if k in params}
        name = expr.name or f"gen_{len(self.variables)}"
        if self.stream and params.get("n", 1) == 1:
            value, meta = self._gen_stream(name, params, options)
            metas = [meta] if meta else []
        elif self.speculation is not None and params.get("n", 1) == 1:
            value, meta = self.speculation.gen(
                lambda p: self.backend.generate(self.text_, p, **options), params
            )
            metas = [meta] if meta else []
            self._append(value, name, meta)
        else:
            result = self.backend.generate(self.text_, params, **options)
            results = result if isinstance(result, list) else [result]
            texts = [r["text"] for r in results]
            metas = [with_logprob_length(r["meta_info"]) for r in results]
            value, meta = (texts, metas) if len(results) > 1 else (texts[0], metas[0])
            self._append(texts[0], name, metas[0])  # n > 1: the text goes on with sample 0
        self.log.add(metas)
        self.meta_info[name] = meta
        self.set_var(name, value)

    def _gen_stream(self, name: str, params: dict, options: dict) -> tuple[str, dict | None]:
        """Stream one gen: the variable's meta_info is updated with every chunk."""
        value, folded = "", StreamMeta()
        for chunk in self.backend.generate_stream(self.text_, params, **options):
            own = folded.add(chunk["meta_info"]) if chunk.get("meta_info") else None
            value += chunk["text"]
            self.meta_info[name] = folded.total
            self._append(chunk["text"], name, own)
        return value, folded.total

    def _sampling_params(self, expr: ir.Gen) -> dict[str, Any]:
        """run's defaults, the gen's own values over them, then SGLang's additions: the
        dtype's and the chat template's stop strings, and global_config's detokenization."""
        params = {**self.defaults, **expr.params}
        extra = [*expr.extra_stop, *self.chat_template.stop_str]
        if extra:
            stop = params.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
            params["stop"] = stop + [s for s in extra if s not in stop]
        if not params.get("stop_regex"):
            params.pop("stop_regex", None)
        params.setdefault("skip_special_tokens", global_config.skip_special_tokens_in_output)
        params.setdefault(
            "spaces_between_special_tokens", global_config.spaces_between_special_tokens_in_out
        )
        return params

    def _separate_reasoning(self, expr: ir.SeparateReasoning) -> None:
        """As SGLang's: each variable keeps the answer, `<name>_reasoning_content` gets the
        reasoning, and the turn's text goes on with the answer alone."""
        model_type = expr.model_type or model_type_of(self.backend.model_path())
        if model_type is None:
            raise ValueError(
                f"separate_reasoning: the served model "
                f"({self.backend.model_path()}) has no known reasoning format; "
                f"give model_type= (radixrt.lang.reasoning.REASONING_FORMATS)"
            )
        for name in expr.names:
            original = self.variables[name]
            reasoning, answer = split_reasoning(original, model_type)
            with self._cond:
                if self.cur_role is not None:  # the turn so far becomes the answer
                    self.text_ = self.text_[: self.role_start] + answer
                elif self.text_.endswith(original):
                    self.text_ = self.text_[: len(self.text_) - len(original)] + answer
            self.set_var(name + "_reasoning_content", reasoning)
            self.set_var(name, answer)

    def _select(self, expr: ir.Select) -> None:
        name = expr.name or f"select_{len(self.variables)}"
        decision = self.backend.select(
            self.text_, expr.choices, expr.temperature, expr.choices_method
        )
        self.log.add(decision.requests)
        self._append(expr.choices[decision.index], name, decision.meta_info)
        self.meta_info[name] = decision.meta_info
        self.set_var(name, expr.choices[decision.index])


def render_constant(nodes: list[ir.Expr], template: ChatTemplate) -> str:
    """The text of the leading text and role nodes, rendered as a program would render them."""
    executor = StreamExecutor(Backend(), template, {})
    for node in nodes:
        if not isinstance(node, (ir.Text, ir.RoleBegin, ir.RoleEnd)):
            break
        executor._execute(node)
    return executor.text_
