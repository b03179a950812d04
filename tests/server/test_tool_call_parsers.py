"""The tool-call parsers of /v1/chat/completions ("auto" formats, the forced-call scanner,
the streamed "auto" hold-back) and a tool call's arguments in the chat template, on
hand-written model outputs: no server, no model."""

from __future__ import annotations

import json

from radixrt.entrypoints.openai.chat_template import template_message as _template_message
from radixrt.entrypoints.openai.protocol import ChatMessage
from radixrt.entrypoints.openai.tool_calls import (
    AutoToolStream,
    ForcedCallScanner,
    hermes_call_tag,
    parse_tool_calls,
    plan_tools,
)


# -- "auto" parsers on hand-written outputs ------------------------------------------------
def _calls(parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def test_hermes_calls_and_text_around_them():
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n'
        "</tool_call>\nDone."
    )
    parsed = parse_tool_calls(text)
    assert _calls(parsed) == [("get_weather", {"city": "Oslo"}), ("get_time", {"zone": "CET"})]
    assert parsed.content == "Let me look.\n\n\nDone."


def test_hermes_unclosed_last_call_and_malformed_json():
    parsed = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"x": 1}}')
    assert _calls(parsed) == [("f", {"x": 1})] and parsed.content is None
    bad = 'Hi <tool_call>{"name": "f", "arguments": {"x": 1</tool_call> <tool_call>{"name": "g"}'
    parsed = parse_tool_calls(bad)
    assert _calls(parsed) == [("g", {})]
    assert parsed.content == 'Hi <tool_call>{"name": "f", "arguments": {"x": 1</tool_call>'


def test_what_auto_s_structural_tag_writes_is_what_the_hermes_parser_reads():
    """Each tag's begin + arguments + end, with text around and several calls."""
    params = {"get_weather": {"type": "object"}, "get-time_2": {"type": "object"}}
    tags = hermes_call_tag(params, parallel=True)["format"]["tags"]
    args = [{"city": "Oslo", "note": 'a "quoted" </tool_call> word'}, {}]
    text = "Checking. " + " and ".join(
        tag["begin"] + json.dumps(a) + tag["end"] for tag, a in zip(tags, args, strict=True)
    )
    parsed = parse_tool_calls(text + " Done.")
    assert _calls(parsed) == list(zip(params, args, strict=True))
    assert parsed.content == "Checking.  and  Done."


def test_the_plans_constraints():
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b")]
    one = plan_tools(tools[:1], "required", None)
    assert (one.mode, one.function_name) == ("named", "a")
    assert one.constraint == ("json_schema", json.dumps({"type": "object", "properties": {}}))
    assert plan_tools(tools, "required", None).mode == "required"
    kind, text = plan_tools(tools, "auto", False).constraint
    tag = json.loads(text)
    assert kind == "structural_tag" and tag["format"]["stop_after_first"] is True
    assert [t["begin"] for t in tag["format"]["tags"]] == [
        f'<tool_call>\n{{"name": "{n}", "arguments": ' for n in ("a", "b")
    ]
    assert plan_tools(tools, "none", None).constraint is None


def test_llama_json_format():
    names = ("get_weather", "get_time")
    parsed = parse_tool_calls('{"name": "get_weather", "parameters": {"city": "Lima"}}', names)
    assert _calls(parsed) == [("get_weather", {"city": "Lima"})] and parsed.content is None
    tagged = (
        '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_weather", '
        '"parameters": {"days": 2}}'
    )
    assert _calls(parse_tool_calls(tagged, names)) == [
        ("get_time", {}),
        ("get_weather", {"days": 2}),
    ]
    # A JSON answer that is not a call of a known tool, broken JSON, or prose: all content.
    for text in (
        '{"name": "Bob", "parameters": {}}',
        '{"answer": 42}',
        '{"name": "get_time", "parameters": {',
        "It is sunny.",
        '{"name": "get_time", "parameters": {}} and more text',
    ):
        parsed = parse_tool_calls(text, names)
        assert parsed.calls == [] and parsed.content == text, text


def test_mistral_format_and_string_arguments():
    text = (
        'Sure. [TOOL_CALLS] [{"name": "a", "arguments": {"q": "x"}}, '
        '{"name": "b", "arguments": "{\\"n\\": 3}"}]'
    )
    parsed = parse_tool_calls(text)
    assert _calls(parsed) == [("a", {"q": "x"}), ("b", {"n": 3})] and parsed.content == "Sure."
    broken = 'Sure. [TOOL_CALLS] [{"name": "a", "arguments": {"q": '
    parsed = parse_tool_calls(broken)
    assert parsed.calls == [] and parsed.content == broken.strip()
    assert parse_tool_calls('[TOOL_CALLS] [{"arguments": {}}]').calls == []


def test_forced_scanner_streams_what_it_reads_whole():
    text = (
        '[{"name": "get_time", "arguments": {"zone": "a}\\"]{", "utc": true}},\n'
        ' {"name":"get_weather","arguments":{"city":"Oslo","days":[1,{"x":2}]}}]'
    )
    whole = ForcedCallScanner()
    whole.feed(text)
    pieces, starts, args = ForcedCallScanner(), [], ["", ""]
    for ch in text:
        for event in pieces.feed(ch):
            if event[0] == "start":
                starts.append(event[2])
            else:
                args[event[1]] += event[2]
    assert starts == ["get_time", "get_weather"]
    assert args == [c.arguments for c in whole.result()]
    assert json.loads(args[0]) == {"zone": 'a}"]{', "utc": True}
    assert json.loads(args[1]) == {"city": "Oslo", "days": [1, {"x": 2}]}


def _stream_auto(text: str, step: int = 1):
    stream = AutoToolStream(("f",))
    sent = "".join(stream.feed(text[i : i + step]) for i in range(0, len(text), step))
    return sent, stream.finish()


def test_auto_stream_holds_calls_back_and_passes_text():
    sent, rest = _stream_auto('Checking <tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert sent == "Checking " and [c.name for c in rest.calls] == ["f"]
    sent, rest = _stream_auto("a < b and [TOOL_ is not a call <tool")
    assert sent + (rest.content or "") == "a < b and [TOOL_ is not a call <tool"
    assert rest.calls == []
    sent, rest = _stream_auto('  {"name": "f", "parameters": {"k": 1}}', step=3)
    assert sent == "" and _calls(rest) == [("f", {"k": 1})]
    sent, rest = _stream_auto("{not json at all}")
    assert sent == "" and rest.content == "{not json at all}" and rest.calls == []


def test_assistant_tool_call_arguments_reach_the_template_as_objects():
    msg = ChatMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": [1, 2]}'},
                }
            ],
        }
    )
    out = _template_message(msg, 0)
    assert out["tool_calls"][0]["function"]["arguments"] == {"x": [1, 2]}
    assert out["content"] == ""
