"""Tool calling for /v1/chat/completions: what `tools` + `tool_choice` ask of the engine
(`ToolPlan.constraint`), and how tool calls are read back out of the model's text (the
parsers are in tool_parsers.py).

- tool_choice "none": no tool calls (the tools still reach the chat template, as OpenAI).
- A named function: the output is that function's arguments, generated under its `parameters`
  JSON schema.
- "required" with one tool: the named choice of that tool (pydantic-ai's output tool sends
  this; the wrapped form below makes small models copy the wrapper into the arguments).
- "required": the output is constrained to `{"name": <one of the tools>, "arguments": <its
  schema>}` (a non-empty JSON array of those unless parallel_tool_calls is false) and read back
  by `ForcedCallScanner`, which also streams the arguments as they are generated.
- "auto": the model answers in its own words; `parse_tool_calls` finds calls written in the
  Hermes / Qwen2.5 (`<tool_call>{...}</tool_call>`), Llama 3.1 (a bare JSON object, maybe after
  `<|python_tag|>`) or Mistral (`[TOOL_CALLS] [{...}]`) formats; `AutoToolStream` streams the
  text that cannot be a call and holds back the rest until the end. The output runs under a
  structural tag (radixrt/grammar/structural_tag.py): free text, but once the model writes
  `<tool_call>` it must go on with `\\n{"name": <a tool>, "arguments": <its schema>}\\n
  </tool_call>`, so a Hermes call that starts always parses (one call at most unless
  parallel_tool_calls). Other formats' markers are left free: their calls are parsed as
  written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from radixrt.entrypoints.openai.tool_parsers import (  # re-exported for the server modules
    HERMES_CLOSE,
    HERMES_OPEN,
    MISTRAL_MARK,
    AutoToolStream,
    ForcedCallScanner,
    ParsedOutput,
    ToolCall,
    new_call_id,
    parse_tool_calls,
)
from radixrt.errors import APIError

__all__ = [
    "AutoToolStream",
    "ForcedCallScanner",
    "MISTRAL_MARK",
    "ParsedOutput",
    "ToolCall",
    "ToolPlan",
    "new_call_id",
    "parse_tool_calls",
    "plan_tools",
    "read_calls",
]

TOOL_CHOICES = ("none", "auto", "required")
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # the OpenAI API's rule for function names
_EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}


# -- the request: what to generate -------------------------------------------------------
@dataclass(frozen=True)
class ToolPlan:
    """mode: "none", "auto", "named" or "required"; `schema` constrains named / required,
    `tag` (a structural tag) constrains the calls "auto" opens."""

    mode: str
    names: tuple[str, ...]
    schema: dict[str, Any] | None = None
    forced_name: str | None = None
    parallel: bool = True
    tag: dict[str, Any] | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("named", "required")

    @property
    def constraint(self) -> tuple[str, str] | None:
        """(sampling param, its text) the engine generates under; None: unconstrained."""
        if self.forced and self.schema is not None:
            return "json_schema", json.dumps(self.schema)
        if self.mode == "auto" and self.tag is not None:
            return "structural_tag", json.dumps(self.tag)
        return None

    @property
    def function_name(self) -> str:
        """The function a "named" plan calls."""
        assert self.forced_name is not None, f"a {self.mode!r} plan names no function"
        return self.forced_name


def plan_tools(
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict | None,
    parallel_tool_calls: bool | None,
) -> ToolPlan | None:
    """The plan for `tools` (OpenAI dicts, shape already checked) and `tool_choice`; None when
    there are no tools. APIError naming `tools` or `tool_choice` for what cannot be served."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise APIError(
                "tool_choice needs tools: give the functions in 'tools', or leave tool_choice out",
                "tool_choice",
            )
        return None
    params = _checked_parameters(tools)
    names = tuple(params)
    parallel = parallel_tool_calls is not False
    mode = _mode(tool_choice, names)
    if mode == "required" and len(names) == 1:
        return ToolPlan("named", names, params[names[0]], names[0], parallel)
    if mode == "named" and isinstance(tool_choice, dict):  # "named": only from an object
        name = tool_choice["function"]["name"]
        return ToolPlan(mode, names, params[name], name, parallel)
    if mode == "required":
        return ToolPlan(mode, names, _required_schema(params, parallel), None, parallel)
    if mode == "auto":
        return ToolPlan(mode, names, None, None, parallel, hermes_call_tag(params, parallel))
    return ToolPlan(mode, names, None, None, parallel)


def _checked_parameters(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name → parameters schema, each checked by xgrammar (the engine's own validator)."""
    from radixrt.grammar.constraint import check_constraint

    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool["function"]
        where = f"tools[{i}].function"
        if not _NAME.match(fn["name"]):
            raise APIError(
                f"{where}.name must match ^[a-zA-Z0-9_-]{{1,64}}$, got {fn['name']!r}",
                f"{where}.name",
            )
        if fn["name"] in out:
            raise APIError(
                f"{where}.name {fn['name']!r} is given twice: names must be unique", f"{where}.name"
            )
        schema = fn.get("parameters") or _EMPTY_PARAMS
        try:
            check_constraint("json_schema", json.dumps(schema))
        except ValueError as e:
            reason = str(e).split(": ", 1)[-1]
            raise APIError(
                f"{where}.parameters is not a valid JSON schema: {reason}", f"{where}.parameters"
            ) from None
        out[fn["name"]] = schema
    return out


def _mode(tool_choice: str | dict | None, names: tuple[str, ...]) -> str:
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise APIError(
                f"tool_choice must be one of {list(TOOL_CHOICES)} or "
                f'{{"type": "function", "function": {{"name": ...}}}}, got '
                f"{tool_choice!r}",
                "tool_choice",
            )
        return tool_choice
    fn = tool_choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if tool_choice.get("type") != "function" or not isinstance(name, str):
        raise APIError(
            'tool_choice as an object must be {"type": "function", "function": '
            f'{{"name": ...}}}}, got {json.dumps(tool_choice)[:80]}',
            "tool_choice",
        )
    if name not in names:
        raise APIError(
            f"tool_choice names the function {name!r}, which is not in tools; "
            f"the tools are {list(names)}",
            "tool_choice",
        )
    return "named"


def _required_schema(params: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """One call: {"name": const, "arguments": schema}, any of the tools; a non-empty array of
    calls when parallel. Properties come out in this order, which ForcedCallScanner needs."""
    cases = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": schema},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, schema in params.items()
    ]
    one = cases[0] if len(cases) == 1 else {"anyOf": cases}
    return {"type": "array", "items": one, "minItems": 1} if parallel else one


def hermes_call_tag(params: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """The structural tag (xgrammar's format) of Hermes calls of these functions: free text
    until `<tool_call>`, then `\\n{"name": "<name>", "arguments": ` + JSON of that function's
    parameters + `}\\n</tool_call>`, as the Hermes / Qwen2.5 templates write a call (and
    _parse_hermes reads it); the output ends after the first call unless `parallel`."""
    tags = [
        {
            "type": "tag",
            "begin": f'{HERMES_OPEN}\n{{"name": {json.dumps(name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": schema},
            "end": f"}}\n{HERMES_CLOSE}",
        }
        for name, schema in params.items()
    ]
    fmt = {
        "type": "triggered_tags",
        "triggers": [HERMES_OPEN],
        "tags": tags,
        "stop_after_first": not parallel,
    }
    return {"type": "structural_tag", "format": fmt}


def read_calls(plan: ToolPlan | None, text: str) -> ParsedOutput:
    """The whole output of a chat choice as content and tool calls, by the plan's mode."""
    if plan is None or plan.mode == "none":
        return ParsedOutput(text, [])
    if plan.mode == "named":
        return ParsedOutput(None, [ToolCall(plan.function_name, text)])
    if plan.mode == "required":
        scanner = ForcedCallScanner()
        scanner.feed(text)
        return ParsedOutput(None, scanner.result())
    return parse_tool_calls(text, plan.names)
