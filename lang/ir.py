"""The program IR: what `s += ...` appends. Expressions are plain data; the executor runs them.

`gen`, `select` and the role functions build expressions; `a + b` concatenates them (strings
become `Text`). The names and arguments follow SGLang's frontend so its programs move over.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

# SGLang's regexes for gen(dtype=...), same values (sglang.lang.ir). An int or a float may
# end with spaces or newlines; SGLang ends them there with the extra stops " " and "\n"
# (DTYPE_STOPS), which are trimmed from the text, so the value is the bare number.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""
REGEX_STRING = REGEX_STR  # radixrt's earlier name
DTYPES = {
    "int": (REGEX_INT, (" ", "\n")),
    "float": (REGEX_FLOAT, (" ", "\n")),
    "bool": (REGEX_BOOL, ()),
    "str": (REGEX_STR, ()),
}

CHOICES_METHODS = (
    "token_length_normalized",
    "greedy_token_selection",
    "unconditional_likelihood_normalized",
)


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
    comes from `run(...)`'s defaults. Request-level options (logprobs) sit in `params` too.
    `extra_stop` is added to whatever stop applies (gen(dtype=int|float)'s " " and "\n")."""

    name: str | None
    params: dict[str, Any] = field(default_factory=dict)
    extra_stop: tuple[str, ...] = ()


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """Split the reasoning out of the variables `names` (see radixrt.lang.reasoning)."""

    model_type: str | None
    names: list[str]


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
    raise TypeError(
        f"cannot append a {type(value).__name__} to a program state; append str or "
        "an expression (gen, select, a role, ...)"
    )


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: list[str] | None = None,
    choices_method: Any = None,
    regex: str | None = None,
    json_schema: str | dict | Any | None = None,
    *,
    seed: int | None = None,
) -> Expr:
    """Generate into variable `name` (with `choices`, a `select` instead); the positional
    order is SGLang's. `regex` and `json_schema` (a JSON string, a dict, or a pydantic model
    class) constrain the output; `stop_regex` ends it where a regex matches (the match is not
    kept); `dtype` is int, float, bool or str (or its name), as SGLang's."""
    if choices:
        if regex is not None or json_schema is not None:
            raise ValueError("gen: choices cannot be combined with regex or json_schema")
        return select(name, choices, temperature=temperature or 0.0, choices_method=choices_method)
    if regex is not None and json_schema is not None:
        raise ValueError("gen: give at most one of regex and json_schema")
    extra_stop: tuple[str, ...] = ()
    if dtype is not None:
        if json_schema is not None:
            raise ValueError("gen: dtype cannot be combined with json_schema")
        if regex is not None:  # as SGLang: the dtype wins
            warnings.warn(
                f"gen: both dtype and regex are set; only dtype={dtype!r} is used", stacklevel=2
            )
        regex, extra_stop = _dtype_regex(dtype)
    params = {
        "max_new_tokens": max_tokens,
        "min_new_tokens": min_tokens,
        "n": n,
        "stop": stop,
        "stop_token_ids": stop_token_ids,
        "stop_regex": stop_regex,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "ignore_eos": ignore_eos,
        "seed": seed,
        "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len,
        "top_logprobs_num": top_logprobs_num,
        "return_text_in_logprobs": return_text_in_logprobs,
        "regex": regex,
        "json_schema": _schema_text(json_schema),
    }
    return Gen(name, {k: v for k, v in params.items() if v is not None}, extra_stop)


def gen_int(
    name: str | None = None,
    max_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    *,
    seed: int | None = None,
) -> Expr:
    """Generate an integer (REGEX_INT; it ends at a space or newline, which is not kept), as
    SGLang's gen_int; the value is its text, e.g. "42"."""
    return gen(dtype=int, **_own_arguments(locals()))


def gen_string(
    name: str | None = None,
    max_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    *,
    seed: int | None = None,
) -> Expr:
    """Generate a double-quoted string of words and spaces (REGEX_STR, quotes included), as
    SGLang's gen_string."""
    return gen(dtype=str, **_own_arguments(locals()))


def _own_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if v is not None}


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: Any = None,
) -> Select:
    """Choose among `choices`; the scoring `choices_method` is one of CHOICES_METHODS (a name
    or the object of that name exported by radixrt)."""
    if not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError("select: choices must be a non-empty list of strings")
    if temperature < 0:
        raise ValueError(f"select: temperature must be >= 0, got {temperature}")
    method = getattr(choices_method, "name", choices_method) or "token_length_normalized"
    if method not in CHOICES_METHODS:
        raise ValueError(
            f"select: choices_method must be one of {', '.join(CHOICES_METHODS)}; "
            f"got {choices_method!r}"
        )
    return Select(name, list(choices), float(temperature), method)


def _dtype_regex(dtype: type | str) -> tuple[str, tuple[str, ...]]:
    """(regex, extra stops) of a gen dtype."""
    key = dtype.__name__ if isinstance(dtype, type) else dtype
    if key not in DTYPES:
        raise ValueError(
            f"gen: dtype must be one of int, float, bool, str (the type or its name), got {dtype!r}"
        )
    return DTYPES[key]


def _schema_text(schema: Any) -> str | None:
    """The engine takes a schema as JSON text; accept a dict or a pydantic model too."""
    if schema is None or isinstance(schema, str):
        return schema
    if hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, dict):
        return json.dumps(schema)
    raise TypeError(
        f"gen: json_schema must be a JSON string, a dict or a pydantic model, "
        f"got {type(schema).__name__}"
    )


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


# -- reasoning and multimodal ---------------------------------------------------------------------
def separate_reasoning(expr: Any = None, model_type: str | None = None) -> Expr:
    """`expr` (an assistant turn's gen or select, with a name), then split its variable's
    reasoning out, as SGLang's: `name` keeps the answer, `name + "_reasoning_content"` gets
    the reasoning, and the text goes on with the answer alone. model_type names the reasoning
    format (radixrt.lang.reasoning.REASONING_FORMATS); None: the served model's, if it has one.
    """
    from radixrt.lang.reasoning import check_model_type

    if model_type is not None:
        check_model_type(model_type)
    names = _generated_names(to_expr(expr)) if expr is not None else []
    if not names:
        raise ValueError(
            "separate_reasoning: expr must contain a gen or select with a name "
            "(its variable is what gets split)"
        )
    return ExprList([to_expr(expr), SeparateReasoning(model_type, names)])


def _generated_names(expr: Expr) -> list[str]:
    items = expr.items if isinstance(expr, ExprList) else [expr]
    names = [e.name for e in items if isinstance(e, (Gen, Select))]
    if any(n is None for n in names):
        raise ValueError("separate_reasoning: every gen or select in expr needs a name")
    return names


def image(path: Any = None, *args: Any, **kwargs: Any) -> Expr:
    """Not supported: radixrt serves text-only models (SGLang's image() needs a vision model)."""
    raise NotImplementedError(
        "radixrt.image: multimodal input is not supported (radixrt serves "
        "text-only models); remove the image from the program"
    )


def video(path: Any = None, num_frames: int | None = None, *args: Any, **kwargs: Any) -> Expr:
    """Not supported: radixrt serves text-only models."""
    raise NotImplementedError(
        "radixrt.video: multimodal input is not supported (radixrt serves "
        "text-only models); remove the video from the program"
    )
