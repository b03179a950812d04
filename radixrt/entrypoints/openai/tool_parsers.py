"""Reading tool calls out of the model's text (what tool_calls.py plans, read back).

- `ForcedCallScanner`: the output of a "required" request, `{"name": ..., "arguments": ...}`
  objects (or an array of them), read and streamed as it grows.
- `parse_tool_calls`: calls written in the model's own format, for "auto": Hermes / Qwen2.5
  (`<tool_call>{...}</tool_call>`, the format "auto" constrains once a call opens), Llama 3.1
  (a bare JSON object, maybe after `<|python_tag|>`) or Mistral (`[TOOL_CALLS] [{...}]`);
  `AutoToolStream` streams the text that cannot be a call and holds back the rest to the end.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_MARK, LLAMA_TAG = "[TOOL_CALLS]", "<|python_tag|>"
# What reading the model's text as JSON may raise: it is any text, nested arbitrarily deep.
_NOT_JSON = (json.JSONDecodeError, RecursionError)
_DECODER = json.JSONDecoder()


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
    """<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, any number of times;
    the last one may lack its closing tag (the model stopped right after the JSON). The JSON
    is read as JSON, so a string argument may hold "</tool_call>" (the structural tag of
    "auto" lets it); an opening that holds no call stays text, up to its closing tag."""
    calls, kept, pos = [], [], 0
    while (start := text.find(HERMES_OPEN, pos)) >= 0:
        call, end = _hermes_call(text, start + len(HERMES_OPEN))
        if call is None:
            close = text.find(HERMES_CLOSE, start)
            end = len(text) if close < 0 else close + len(HERMES_CLOSE)
            kept.append(text[pos:end])
        else:
            kept.append(text[pos:start])
            calls.append(call)
        pos = end
    kept.append(text[pos:])
    return ParsedOutput(_content(kept), calls)


def _hermes_call(text: str, body: int) -> tuple[ToolCall | None, int]:
    """The call whose JSON starts at `body` (after whitespace) and where it ends: after its
    closing tag, or at the end of the text when the JSON is the last thing there."""
    start = len(text) - len(text[body:].lstrip())
    try:
        obj, end = _DECODER.raw_decode(text, start)
    except _NOT_JSON:
        return None, 0
    after = len(text) - len(text[end:].lstrip())
    if text.startswith(HERMES_CLOSE, after):
        end = after + len(HERMES_CLOSE)
    elif after == len(text):
        end = after
    else:
        return None, 0
    return _call_from(obj), end


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
