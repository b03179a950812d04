"""The program IR: what `s += ...` appends. Expressions are plain data; the executor runs them.

`gen`, `select` and the role functions build expressions; `a + b` concatenates them (strings
become `Text`). The names and arguments follow SGLang's frontend so its programs move over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# gen_int / gen_string constrain the output with these (through the engine's regex support),
# as SGLang's do. The int may end with one space or newline: without a way to end the number,
# a model that wants to write " years" after "34" can only add digits (or stop outright).
REGEX_INT = r"[-+]?[0-9]+[ \n]?"
REGEX_STRING = r'"[^"\\\n]*"'

CHOICES_METHODS = ("token_length_normalized", "greedy_token_selection",
                   "unconditional_likelihood_normalized")


class Expr:
    """Base of every IR node; `+` concatenates into an ExprList."""

    def __add__(self, other: Any) -> ExprList:
        return ExprList([self, to_expr(other)])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([to_expr(other), self])


@dataclass(eq=False)
class Text(Expr):
    value: str


@dataclass(eq=False)
class ExprList(Expr):
    items: list[Expr]

    def __post_init__(self) -> None:  # keep it flat: (a + b) + c is one list of three
        flat: list[Expr] = []
        for item in self.items:
            flat.extend(item.items if isinstance(item, ExprList) else [item])
        self.items = flat


@dataclass(eq=False)
class Gen(Expr):
    """Generate text into variable `name`. `params` holds only what the caller set; the rest
    comes from `run(...)`'s defaults. Request-level options (logprobs) sit in `params` too."""
    name: str | None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Select(Expr):
    """Pick one of `choices` by scoring each against the text so far."""
    name: str | None
    choices: list[str]
    temperature: float = 0.0
    choices_method: str = "token_length_normalized"


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(eq=False)
class ConcatAndAppend(Expr):
    """Append, in order, the text each fork added after the fork point (join's second mode)."""
    forks: list[Any]


def to_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    if isinstance(value, (int, float)):
        return Text(str(value))
    raise TypeError(f"cannot append a {type(value).__name__} to a program state; append str or "
                    "an expression (gen, select, a role, ...)")


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
        n: int | None = None, stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None, temperature: float | None = None,
        top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
        frequency_penalty: float | None = None, presence_penalty: float | None = None,
        ignore_eos: bool | None = None, seed: int | None = None,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
        dtype: type | str | None = None, choices: list[str] | None = None,
        choices_method: Any = None, regex: str | None = None,
        json_schema: str | dict | Any | None = None) -> Expr:
    """Generate into variable `name` (with `choices`, a `select` instead). `regex` and
    `json_schema` (a JSON string, a dict, or a pydantic model class) constrain the output;
    `dtype=int` / `dtype=str` is `gen_int` / `gen_string`."""
    if choices is not None:
        if regex is not None or json_schema is not None:
            raise ValueError("gen: choices cannot be combined with regex or json_schema")
        return select(name, choices, temperature=temperature or 0.0,
                      choices_method=choices_method)
    if regex is not None and json_schema is not None:
        raise ValueError("gen: give at most one of regex and json_schema")
    if dtype is not None:
        if regex is not None or json_schema is not None:
            raise ValueError("gen: dtype cannot be combined with regex or json_schema")
        regex = _dtype_regex(dtype)
    params = {"max_new_tokens": max_tokens, "min_new_tokens": min_tokens, "n": n, "stop": stop,
              "stop_token_ids": stop_token_ids, "temperature": temperature, "top_p": top_p,
              "top_k": top_k, "min_p": min_p, "frequency_penalty": frequency_penalty,
              "presence_penalty": presence_penalty, "ignore_eos": ignore_eos, "seed": seed,
              "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
              "top_logprobs_num": top_logprobs_num, "regex": regex,
              "json_schema": _schema_text(json_schema)}
    return Gen(name, {k: v for k, v in params.items() if v is not None})


def gen_int(name: str | None = None, **kwargs: Any) -> Expr:
    """Generate an integer, as SGLang's gen_int: the value is its text ("42", maybe with one
    trailing space or newline; int() takes both)."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Expr:
    """Generate a double-quoted string on one line (quotes included), as SGLang's gen_string."""
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: list[str] | None = None,
           temperature: float = 0.0, choices_method: Any = None) -> Select:
    """Choose among `choices`; the scoring `choices_method` is one of CHOICES_METHODS (a name
    or the object of that name exported by radixrt)."""
    if not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError("select: choices must be a non-empty list of strings")
    if temperature < 0:
        raise ValueError(f"select: temperature must be >= 0, got {temperature}")
    method = getattr(choices_method, "name", choices_method) or "token_length_normalized"
    if method not in CHOICES_METHODS:
        raise ValueError(f"select: choices_method must be one of {', '.join(CHOICES_METHODS)}; "
                         f"got {choices_method!r}")
    return Select(name, list(choices), float(temperature), method)


def _dtype_regex(dtype: type | str) -> str:
    if dtype in (int, "int"):
        return REGEX_INT
    if dtype in (str, "str"):
        return REGEX_STRING
    raise ValueError(f"gen: dtype must be int or str, got {dtype!r}")


def _schema_text(schema: Any) -> str | None:
    """The engine takes a schema as JSON text; accept a dict or a pydantic model too."""
    if schema is None or isinstance(schema, str):
        return schema
    if hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, dict):
        return json.dumps(schema)
    raise TypeError(f"gen: json_schema must be a JSON string, a dict or a pydantic model, "
                    f"got {type(schema).__name__}")


# -- chat roles ---------------------------------------------------------------------------------
def role(name: str, expr: Any = None) -> Expr:
    """`name`'s turn around `expr` (begin + expr + end); rendered by the model's chat template."""
    if expr is None:
        return ExprList([RoleBegin(name), RoleEnd(name)])
    return ExprList([RoleBegin(name), to_expr(expr), RoleEnd(name)])


def system(expr: Any = None) -> Expr:
    return role("system", expr)


def user(expr: Any = None) -> Expr:
    return role("user", expr)


def assistant(expr: Any = None) -> Expr:
    return role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
