"""Tool calling for /v1/chat/completions: what `tools` + `tool_choice` ask of the engine, and
how tool calls are read back out of the model's text.

- tool_choice "none": no tool calls (the tools still reach the chat template, as OpenAI).
- A named function: the output is that function's arguments, generated under its `parameters`
  JSON schema.
- "required": the output is constrained to `{"name": <one of the tools>, "arguments": <its
  schema>}` (a non-empty JSON array of those unless parallel_tool_calls is false) and read back
  by `ForcedCallScanner`, which also streams the arguments as they are generated.
- "auto": the model answers in its own words; `parse_tool_calls` finds calls written in the
  Hermes / Qwen2.5 (`<tool_call>{...}</tool_call>`), Llama 3.1 (a bare JSON object, maybe after
  `<|python_tag|>`) or Mistral (`[TOOL_CALLS] [{...}]`) formats; `AutoToolStream` streams the
  text that cannot be a call and holds back the rest until the end.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from radixrt.server.http_utils import APIError

TOOL_CHOICES = ("none", "auto", "required")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_MARK, LLAMA_TAG = "[TOOL_CALLS]", "<|python_tag|>"
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # the OpenAI API's rule for function names
_EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}
# What reading the model's text as JSON may raise: it is any text, nested arbitrarily deep.
_NOT_JSON = (json.JSONDecodeError, RecursionError)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as the OpenAI API returns it
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None  # the text outside the calls; None when there is none
    calls: list[ToolCall]


# -- the request: what to generate -------------------------------------------------------
@dataclass(frozen=True)
class ToolPlan:
    """mode: "none", "auto", "named" or "required"; `schema` constrains named / required."""

    mode: str
    names: tuple[str, ...]
    schema: dict[str, Any] | None = None
    forced_name: str | None = None
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.mode in ("named", "required")

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
    if mode == "named" and isinstance(tool_choice, dict):  # "named": only from an object
        name = tool_choice["function"]["name"]
        return ToolPlan(mode, names, params[name], name, parallel)
    if mode == "required":
        return ToolPlan(mode, names, _required_schema(params, parallel), None, parallel)
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


# -- forced calls: read (and stream) the constrained output --------------------------------
_HEAD = re.compile(r'[\s\[\],}]*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class ForcedCallScanner:
    """Reads the output of a "required" request, {"name", "arguments"} objects (or an array of
    them), as it grows. `feed` returns events: ("start", index, name) when a call's name is
    complete, ("args", index, text) for each new piece of its arguments' JSON text."""

    def __init__(self) -> None:
        self.text = ""
        self.calls: list[list[str]] = []  # [name, arguments so far]
        self._pos = 0  # where scanning resumes
        self._in_args = False
        self._depth, self._in_str, self._escape = 0, False, False

    def feed(self, delta: str) -> list[tuple]:
        self.text += delta
        events: list[tuple] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[tuple]) -> bool:
        if not self._in_args:
            m = _HEAD.match(self.text, self._pos)
            if m is None or m.end() == len(self.text):  # whitespace may still follow
                return False
            self.calls.append([json.loads(f'"{m.group(1)}"'), ""])
            events.append(("start", len(self.calls) - 1, self.calls[-1][0]))
            self._pos, self._in_args = m.end(), True
        end, done = self._scan_value(self._pos)
        piece = self.text[self._pos : end]
        if piece:
            self.calls[-1][1] += piece
            events.append(("args", len(self.calls) - 1, piece))
        self._pos, self._in_args = end, not done
        return done

    def _scan_value(self, start: int) -> tuple[int, bool]:
        """(where the scan stopped, whether the arguments' value closed there)."""
        for i in range(start, len(self.text)):
            ch = self.text[i]
            if self._escape:
                self._escape = False
            elif self._in_str:
                self._escape = ch == "\\"
                self._in_str = ch != '"'
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1, True
        return len(self.text), False

    def result(self) -> list[ToolCall]:
        return [ToolCall(name, args) for name, args in self.calls]


# -- auto: calls in the model's own format --------------------------------------------------
def parse_tool_calls(text: str, names: tuple[str, ...] | None = None) -> ParsedOutput:
    """Calls in `text`, by its markers: Mistral's [TOOL_CALLS], Hermes' <tool_call>, else a
    Llama 3.1 JSON object (whose name must be one of `names`, when given, since a bare JSON
    answer is not a call). A call that does not parse stays in the content as text."""
    if MISTRAL_MARK in text:
        return _parse_mistral(text)
    if HERMES_OPEN in text:
        return _parse_hermes(text)
    return _parse_llama(text, names)


def _content(parts: list[str]) -> str | None:
    text = "".join(parts).strip()
    return text or None


def _call_from(
    obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")
) -> ToolCall | None:
    """A ToolCall from {"name": str, "arguments" | "parameters": object}, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args: Any = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as JSON text
        try:
            args = json.loads(args)
        except _NOT_JSON:
            return None
    if not isinstance(args, dict):
        return None
    try:
        return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
    except RecursionError:
        return None


def _parse_hermes(text: str) -> ParsedOutput:
    """<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, any number of times;
    the last one may lack its closing tag (the model stopped right after the JSON)."""
    pattern = re.compile(
        rf"{re.escape(HERMES_OPEN)}(.*?)(?:{re.escape(HERMES_CLOSE)}|$)", re.DOTALL
    )
    calls, kept, pos = [], [], 0
    for m in pattern.finditer(text):
        call = _loads_call(m.group(1))
        kept.append(text[pos : m.start()] if call else text[pos : m.end()])
        pos = m.end()
        if call:
            calls.append(call)
    kept.append(text[pos:])
    return ParsedOutput(_content(kept), calls)


def _loads_call(text: str) -> ToolCall | None:
    try:
        return _call_from(json.loads(text))
    except _NOT_JSON:
        return None


def _parse_llama(text: str, names: tuple[str, ...] | None) -> ParsedOutput:
    """The whole message is {"name": ..., "parameters": {...}} (Llama 3.1), maybe after
    <|python_tag|>; several calls separated by ';' are accepted too (Llama 3.2)."""
    body = text.strip().removeprefix(LLAMA_TAG).strip()
    if not body.startswith("{"):
        return ParsedOutput(_content([text]), [])
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while pos < len(body):
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except _NOT_JSON:
            return ParsedOutput(_content([text]), [])
        call = _call_from(obj, ("parameters", "arguments"))
        if call is None or (names is not None and call.name not in names):
            return ParsedOutput(_content([text]), [])
        calls.append(call)
        pos = len(body) - len(body[pos:].lstrip().removeprefix(";").lstrip())
    return ParsedOutput(None, calls)


def _parse_mistral(text: str) -> ParsedOutput:
    """Text, then [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]."""
    before, _, after = text.partition(MISTRAL_MARK)
    try:
        obj, end = json.JSONDecoder().raw_decode(after.strip())
    except _NOT_JSON:
        return ParsedOutput(_content([text]), [])
    items = obj if isinstance(obj, list) else [obj]
    calls = [call for call in map(_call_from, items) if call is not None]
    if not calls or len(calls) < len(items):
        return ParsedOutput(_content([text]), [])
    return ParsedOutput(_content([before, after.strip()[end:]]), calls)


class AutoToolStream:
    """Streaming for "auto": text that cannot start a call goes out at once; from the first
    sign of a call (a <tool_call> or [TOOL_CALLS] marker, or a message that opens with `{` or
    <|python_tag|>) the rest is held and parsed when the output ends."""

    _MARKERS = (HERMES_OPEN, MISTRAL_MARK)
    _OPENERS = ("{", LLAMA_TAG)

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.held = ""  # text not sent yet
        self.holding = False  # a call may have started: hold everything to the end
        self.started = False  # some non-space text was seen

    def feed(self, delta: str) -> str:
        """The text to send now."""
        self.held += delta
        if self.holding:
            return ""
        if not self.started:
            head = self.held.lstrip()
            if not head or any(o.startswith(head) for o in self._OPENERS if len(head) < len(o)):
                return ""
            self.started = True
            if head.startswith(self._OPENERS):
                self.holding = True
                return ""
        return self._release()

    def _release(self) -> str:
        marks = [i for i in (self.held.find(m) for m in self._MARKERS) if i >= 0]
        if marks:
            out, self.held, self.holding = self.held[: min(marks)], self.held[min(marks) :], True
            return out
        keep = max(
            (k for m in self._MARKERS for k in range(1, len(m)) if self.held.endswith(m[:k])),
            default=0,
        )
        cut = len(self.held) - keep
        out, self.held = self.held[:cut], self.held[cut:]
        return out

    def finish(self) -> ParsedOutput:
        """What was held back, parsed: its text content and the calls."""
        if not self.holding:
            return ParsedOutput(self.held or None, [])
        return parse_tool_calls(self.held, self.names)


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
