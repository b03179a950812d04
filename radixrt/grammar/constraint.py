"""Which constraint a request carries, and whether its text is acceptable.

Two levels, so that nothing slow or unbounded runs where it must not:
- `check_constraint_size` (cheap, linear, no xgrammar): at most MAX_CONSTRAINT_CHARS, a JSON
  schema that is JSON text of an object nested at most MAX_SCHEMA_DEPTH deep. SamplingParams
  runs it on every request, in the frontend and in the scheduler.
- `parse_constraint` (xgrammar's parser; a deep schema takes seconds): the frontend's
  ConstraintChecker and the scheduler's GrammarBackend run it on worker threads, bounded in
  time by --grammar-compile-timeout. `check_constraint` is both, cached by text.
Errors are ParamError naming the field (regex, json_schema, ebnf or structural_tag): HTTP 400s.
The structural tag's shapes and their translation to xgrammar are in structural_tag.py.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from radixrt.errors import ParamError
from radixrt.grammar import structural_tag

CONSTRAINT_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")
_WHAT = {
    "regex": "regular expression",
    "json_schema": "JSON schema",
    "ebnf": "EBNF grammar (xgrammar's dialect)",
    "structural_tag": "structural tag",
}
# Sizes past which a constraint is refused before anything parses it. Real schemas (tool
# parameters, response formats) are a few KB and nest a few levels; OpenAI's structured
# outputs allow 10 levels of nesting. Each schema level is two JSON levels (the schema object
# and its "properties"), so 128 JSON levels is 64 schema levels; xgrammar takes ~20 ms there,
# 0.7 s at 200 levels and grows as the cube, and Python's json recurses (RecursionError
# near 1,000).
MAX_CONSTRAINT_CHARS = 200_000
MAX_SCHEMA_DEPTH = 128
# xgrammar 0.2 writes the characters of a string with maxLength as [^"\\\r\n], which admits
# raw control characters (a tab, \x01) that JSON forbids inside strings; we tighten it.
_LOOSE_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\]"
_JSON_TOKEN = re.compile(r'[\[\]{}"]')
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)  # after the opening quote


def constraint_of(params) -> tuple[str, str] | None:
    """(kind, text) of the one constraint in SamplingParams, or None; error if several."""
    given = [name for name in CONSTRAINT_FIELDS if getattr(params, name) is not None]
    if len(given) > 1:
        raise ParamError(
            given[1],
            f"give at most one of the sampling params {list(CONSTRAINT_FIELDS)}; got {given}",
        )
    return (given[0], getattr(params, given[0])) if given else None


def check_constraint_size(kind: str, text: str) -> None:
    """ParamError unless `text` is short enough and, for a JSON schema, JSON text of an
    object (or a bool) nested at most MAX_SCHEMA_DEPTH deep; a structural tag, the same depth
    and one of its shapes. Linear in len(text)."""
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise ParamError(
            kind,
            f"sampling param {kind!r} has {len(text)} characters; at most "
            f"{MAX_CONSTRAINT_CHARS} are allowed",
        )
    if kind not in ("json_schema", "structural_tag"):
        return
    depth = json_text_depth(text)
    if depth > MAX_SCHEMA_DEPTH:
        raise _too_deep(depth, kind)
    if kind == "structural_tag":
        structural_tag.check_shape(text)
        return
    try:
        schema = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ParamError(kind, f"sampling param 'json_schema' is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise ParamError(
            kind,
            "sampling param 'json_schema' must be a JSON object (a "
            f"schema), got {type(schema).__name__}",
        )


def json_text_depth(text: str) -> int:
    """How deep objects and arrays nest in JSON text (strings skipped), without recursion and
    in one pass (an unterminated string ends the scan: json.loads refuses the text anyway)."""
    depth = deepest = pos = 0
    while (found := _JSON_TOKEN.search(text, pos)) is not None:
        char, pos = found.group(), found.end()
        if char == '"':
            rest = _STRING_REST.match(text, pos)
            if rest is None:
                break
            pos = rest.end()
        else:
            depth += 1 if char in "[{" else -1
            deepest = max(deepest, depth)
    return deepest


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether dicts and lists inside `value` nest more than `limit` deep (without recursion,
    stopping at the first path past the limit)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))
    return False


def schema_object_text(schema: dict, kind: str = "json_schema") -> str:
    """A schema (or structural tag) given as a dict, as JSON text; ParamError if it nests past
    MAX_SCHEMA_DEPTH (measured without recursion, before json.dumps recurses into it)."""
    if nests_deeper_than(schema, MAX_SCHEMA_DEPTH):
        raise _too_deep(f"more than {MAX_SCHEMA_DEPTH}", kind)
    try:
        return json.dumps(schema)
    except (TypeError, ValueError) as e:  # a value JSON cannot hold, a cycle
        raise ParamError(kind, f"sampling param {kind!r} is not JSON: {e}") from None


def _too_deep(depth: object, kind: str = "json_schema") -> ParamError:
    return ParamError(
        kind,
        f"sampling param {kind!r} nests {depth} levels deep; at "
        f"most {MAX_SCHEMA_DEPTH} (objects and arrays inside one another) "
        "are allowed",
    )


def parse_constraint(xgr: Any, kind: str, text: str, any_whitespace: bool = False) -> Any:
    """The xgrammar Grammar of a constraint; ParamError naming the field if `text` is
    not a valid one. JSON schemas get json.dumps' spacing unless `any_whitespace` (small models
    given the freedom tend to loop on newlines until max_new_tokens cuts the JSON short)."""
    check_constraint_size(kind, text)
    if kind == "json_schema":
        return _json_schema_grammar(xgr, text, any_whitespace)
    if kind == "structural_tag":
        tag = structural_tag.check_shape(text)
        spaced = structural_tag.to_xgrammar_format(
            tag, lambda schema: str(_json_schema_grammar(xgr, schema, any_whitespace))
        )
        return _xgrammar_parse(kind, xgr.Grammar.from_structural_tag, spaced)
    parse = xgr.Grammar.from_regex if kind == "regex" else xgr.Grammar.from_ebnf
    return _xgrammar_parse(kind, parse, text)


def _json_schema_grammar(xgr: Any, text: str, any_whitespace: bool) -> Any:
    """The grammar of a JSON schema, its strings without raw control characters."""
    check_constraint_size("json_schema", text)
    parse = functools.partial(xgr.Grammar.from_json_schema, any_whitespace=any_whitespace)
    grammar = _xgrammar_parse("json_schema", parse, text)
    ebnf = str(grammar)
    if _LOOSE_STRING_CHAR in ebnf:
        grammar = xgr.Grammar.from_ebnf(ebnf.replace(_LOOSE_STRING_CHAR, _JSON_STRING_CHAR))
    return grammar


def _xgrammar_parse(kind: str, parse: Any, text: str) -> Any:
    try:
        return parse(text)
    except Exception as e:  # noqa: BLE001 - xgrammar raises several types for bad input
        # xgrammar prefixes its messages with a time and a C++ source location.
        reason = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip()) or type(e).__name__
        raise ParamError(
            kind, f"sampling param {kind!r} is not a valid {_WHAT[kind]}: {reason}"
        ) from None


@functools.lru_cache(maxsize=1024)
def check_constraint(kind: str, text: str) -> None:
    """ParamError naming the field if `text` is not a valid constraint of `kind`.
    Runs xgrammar's parser in the caller's thread (in a process that cannot import torch,
    in its xgrammar child, the caller waiting): unbounded in time for large inputs."""
    from radixrt.grammar import xgrammar_process

    if xgrammar_process.needed():
        message = xgrammar_process.shared().call("parse", kind=kind, text=text).result()
        if message is not None:
            raise ParamError(kind, message)
        return
    import xgrammar as xgr

    parse_constraint(xgr, kind, text)
