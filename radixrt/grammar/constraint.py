"""Which constraint a request carries, and whether its text is valid: checked in the frontend
so that a bad regex or schema is a clear error in the caller's frame (a 400 from the server),
before the request reaches the scheduler. Needs xgrammar, imported on first use."""

from __future__ import annotations

import functools
import json
import re

CONSTRAINT_FIELDS = ("regex", "json_schema", "ebnf")
_WHAT = {"regex": "regular expression", "json_schema": "JSON schema",
         "ebnf": "EBNF grammar (xgrammar's dialect)"}


def constraint_of(params) -> tuple[str, str] | None:
    """(kind, text) of the one constraint in SamplingParams, or None; ValueError if several."""
    given = [name for name in CONSTRAINT_FIELDS if getattr(params, name) is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of the sampling params {list(CONSTRAINT_FIELDS)}; "
                         f"got {given}")
    return (given[0], getattr(params, given[0])) if given else None


@functools.lru_cache(maxsize=1024)
def check_constraint(kind: str, text: str) -> None:
    """ValueError naming the field if `text` is not a valid constraint of `kind`."""
    import xgrammar as xgr

    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"sampling param 'json_schema' is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError("sampling param 'json_schema' must be a JSON object (a schema), "
                             f"got {type(schema).__name__}")
    build = {"regex": xgr.Grammar.from_regex, "json_schema": xgr.Grammar.from_json_schema,
             "ebnf": xgr.Grammar.from_ebnf}[kind]
    try:
        build(text)
    except Exception as e:  # noqa: BLE001 - xgrammar raises several types for bad input
        # xgrammar prefixes its messages with a time and a C++ source location.
        reason = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip()) or type(e).__name__
        raise ValueError(f"sampling param {kind!r} is not a valid {_WHAT[kind]}: "
                         f"{reason}") from None
