"""SGLang's `structural_tag` sampling param: free text, with constrained parts where the output
opens one (xgrammar's structural tags; tool calls are the use).

Two shapes are accepted, those SGLang's xgrammar backend takes:
- the original one: {"type": "structural_tag", "structures": [{"begin": str, "schema": JSON
  schema, "end": str}, ...], "triggers": [str, ...]}. The output is free text until it writes
  a trigger; from there it must write one of the begin strings that starts with that trigger,
  then JSON of that structure's schema, then its end string, and then free text again.
  The schemas are spaced as the server spaces every JSON schema (json.dumps' spacing unless
  --json-any-whitespace), so that a small model cannot loop on newlines inside a call.
- xgrammar's own: {"type": "structural_tag", "format": {...}}, checked by xgrammar; its plain
  {"type": "json_schema", "json_schema": ...} contents are spaced the same way.
"type" may be left out. Everything else is a ParamError naming `structural_tag`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from radixrt.errors import ParamError

FIELD = "structural_tag"
SHAPES = (
    '{"type": "structural_tag", "structures": [{"begin": str, "schema": a JSON schema, '
    '"end": str}, ...], "triggers": [str, ...]} (each begin starting with one of the '
    'triggers), or {"type": "structural_tag", "format": {...}} (xgrammar\'s format)'
)


def refuse(why: str) -> ParamError:
    return ParamError(FIELD, f"sampling param 'structural_tag' {why}; allowed: {SHAPES}")


def check_shape(text: str) -> dict[str, Any]:
    """The structural tag of `text` (JSON), its shape checked (not its schemas, which
    `to_xgrammar_format` compiles); ParamError naming structural_tag otherwise."""
    try:
        tag = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise refuse(f"is not valid JSON ({e})") from None
    if not isinstance(tag, dict):
        raise refuse(f"must be a JSON object, got {type(tag).__name__}")
    if tag.get("type", FIELD) != FIELD:
        raise refuse(f"has type {tag.get('type')!r}, not 'structural_tag'")
    if "structures" in tag:
        _check_legacy(tag)
    elif not isinstance(tag.get("format"), dict):
        raise refuse('has neither "structures" and "triggers" nor a "format" object')
    return tag


def _check_legacy(tag: dict[str, Any]) -> None:
    unknown = sorted(set(tag) - {"type", "structures", "triggers"})
    if unknown:
        raise refuse(f"has unknown keys {unknown}")
    triggers, structures = tag.get("triggers"), tag["structures"]
    if not _strings(triggers) or not triggers:
        raise refuse(f'needs "triggers", a non-empty list of non-empty strings, got {triggers!r}')
    if not isinstance(structures, list) or not structures:
        raise refuse('needs "structures", a non-empty list')
    for i, item in enumerate(structures):
        where = f"structures[{i}]"
        if not isinstance(item, dict) or set(item) != {"begin", "schema", "end"}:
            raise refuse(f'{where} must have exactly the keys "begin", "schema", "end"')
        if not isinstance(item["begin"], str) or not isinstance(item["end"], str):
            raise refuse(f"{where}.begin and .end must be strings")
        if not isinstance(item["schema"], (dict, bool)):
            raise refuse(f"{where}.schema must be a JSON schema (an object)")
        if not any(item["begin"].startswith(t) for t in triggers):
            raise refuse(f"{where}.begin {item['begin']!r} starts with none of the triggers")


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(s, str) and s for s in value)


def to_xgrammar_format(tag: dict[str, Any], schema_ebnf: Callable[[str], str]) -> str:
    """The JSON text xgrammar's Grammar.from_structural_tag takes for a checked tag: an
    original-shape tag becomes xgrammar's triggered tags, and each plain JSON schema content
    becomes the EBNF `schema_ebnf(schema text)` writes (the server's spacing)."""
    if "structures" in tag:
        fmt = _triggered_tags(tag, schema_ebnf)
    else:
        fmt = _spaced(tag["format"], schema_ebnf, "format")
    return json.dumps({"type": FIELD, "format": fmt})


def _triggered_tags(tag: dict[str, Any], schema_ebnf: Callable[[str], str]) -> dict[str, Any]:
    tags = [
        {
            "type": "tag",
            "begin": item["begin"],
            "content": _grammar(item["schema"], schema_ebnf, f"structures[{i}].schema"),
            "end": item["end"],
        }
        for i, item in enumerate(tag["structures"])
    ]
    return {"type": "triggered_tags", "triggers": tag["triggers"], "tags": tags}


def _spaced(node: Any, schema_ebnf: Callable[[str], str], where: str) -> Any:
    """`node` with every {"type": "json_schema", "json_schema": ...} in it (no other options:
    those are left to xgrammar) as grammar content. Recursion is bounded: the text nests at
    most MAX_SCHEMA_DEPTH levels (check_constraint_size)."""
    if isinstance(node, list):
        return [_spaced(v, schema_ebnf, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and set(node) == {"type", "json_schema"}:
        return _grammar(node["json_schema"], schema_ebnf, f"{where}.json_schema")
    return {k: _spaced(v, schema_ebnf, f"{where}.{k}") for k, v in node.items()}


def _grammar(schema: Any, schema_ebnf: Callable[[str], str], where: str) -> dict[str, str]:
    try:
        return {"type": "grammar", "grammar": schema_ebnf(json.dumps(schema))}
    except ParamError as e:
        reason = str(e).split(": ", 1)[-1]
        message = f"sampling param 'structural_tag' has an invalid JSON schema at {where}: {reason}"
        raise ParamError(FIELD, message) from None
