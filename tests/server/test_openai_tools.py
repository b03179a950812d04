"""Structured outputs and tool calls in /v1/chat/completions on a real uvicorn server (loopback,
tiny random model) with the `openai` client (the parsers alone: test_tool_call_parsers.py; on
the default model: test_tool_calls_default_model.py).
The tiny model's text is random, but constrained output parses once it stops. The
requests sample (temperature 1, fixed seeds) with whitespace tokens banned by logit_bias (JSON
allows whitespace between any two tokens, and a random model may loop on it) and assert that
they stopped rather than ran out of tokens."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from test_openai_api import MODEL, server, template_ids  # noqa: F401 - the fixture

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "unit": {"enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
# (Not maxLength: xgrammar 0.2.9 lets such strings hold raw control characters, not JSON.)
TIME = {
    "type": "object",
    "properties": {
        "zone": {"type": "string", "pattern": "^[A-Z]{2,4}$"},
        "utc": {"type": "boolean"},
    },
    "required": ["zone", "utc"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


# -- the server ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(server):  # noqa: F811
    return openai.OpenAI(base_url=f"{server[1]}/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def sample(server) -> dict:  # noqa: F811
    tok = server[0].tokenizer
    ban = {str(tok.encode(c, add_special_tokens=False)[0]): -100 for c in " \t\n\r"}
    assert len(ban) == 4
    return {"temperature": 1.0, "max_tokens": 300, "logit_bias": ban}


def _check_call(call, names=("get_weather",)) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


@pytest.mark.parametrize("seed", [0, 1])
def test_named_tool_choice(client, sample, seed):
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, seed=seed, **sample
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    _check_call(choice.message.tool_calls[0])


def test_required_with_two_tools(client, sample):
    names = set()
    for seed, parallel in ((0, True), (3, True), (0, False), (3, False)):
        resp = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            seed=seed,
            parallel_tool_calls=parallel,
            **sample,
        )
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, parallel, choice)
        calls = choice.message.tool_calls
        assert calls and (parallel or len(calls) == 1)
        for call in calls:
            _check_call(call, tuple(SCHEMAS))
            names.add(call.function.name)
        assert len({c.id for c in calls}) == len(calls)
    assert names, "no tool was called"


def test_required_with_one_tool_is_the_named_choice(client, sample):
    """The output is the tool's arguments themselves (no {"name", "arguments"} wrapper)."""
    for seed in (0, 1):
        resp = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS[:1], tool_choice="required", seed=seed, **sample
        )
        named = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS[:1], tool_choice=NAMED, seed=seed, **sample
        )
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        _check_call(call)
        assert call.function == named.choices[0].message.tool_calls[0].function


def _stream_calls(client, sample, **kwargs) -> tuple[dict[int, dict], list[str | None], list]:
    """The streamed calls joined by index, the finish reasons, and the tool deltas."""
    calls: dict[int, dict] = {}
    finishes, deltas = [], []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, stream=True, **kwargs, **sample
    ):
        choice = chunk.choices[0]
        finishes.append(choice.finish_reason)
        for delta in choice.delta.tool_calls or []:
            deltas.append(delta)
            call = calls.setdefault(
                delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""}
            )
            call["arguments"] += delta.function.arguments or ""
    return calls, finishes, deltas


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_streamed_call_equals_the_whole_one(client, sample, tool_choice):
    calls, finishes, deltas = _stream_calls(client, sample, tool_choice=tool_choice, seed=3)
    assert finishes[-1] == "tool_calls" and not any(finishes[:-1])
    first = deltas[0]
    assert first.id.startswith("call_") and first.type == "function"
    assert first.function.name and first.function.arguments == ""
    assert all(
        d.id is None and d.function.name is None for d in deltas[1:] if d.index == first.index
    )
    assert len(deltas) > len(calls) + 2, "the arguments came in one piece"
    whole = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, seed=3, **sample
    )
    want = whole.choices[0].message.tool_calls
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in want
    ]
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_auto_without_a_call_is_text_streamed_or_not(client):
    whole = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, seed=5, temperature=1.0, max_tokens=24
    )
    choice = whole.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, seed=5, temperature=1.0, max_tokens=24, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text.strip() == (choice.message.content or "").strip()
    # "none": the same prompt (this template ignores tools), so the same sample, never parsed.
    none = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        seed=5,
        temperature=1.0,
        max_tokens=24,
        tool_choice="none",
    )
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content.strip() == (choice.message.content or "").strip()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "fmt,schema",
    [
        ({"type": "json_object"}, {"type": "object"}),
        ({"type": "json_object", "schema": WEATHER}, WEATHER),  # instructor's JSON_SCHEMA mode
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": WEATHER, "strict": True},
            },
            WEATHER,
        ),
    ],
)
def test_response_format(client, server, sample, fmt, schema, stream):  # noqa: F811
    # Any JSON object may hold strings, which the random model would rarely close: a bias
    # towards '"' and '}' makes it stop soon (the grammar still decides what may come).
    tok = server[0].tokenizer
    bias = {str(tok.convert_tokens_to_ids(c)): 8 for c in '"}'}
    kwargs = {"model": MODEL, "messages": ASK, "response_format": fmt, "seed": 1, **sample}
    kwargs["logit_bias"] = {**sample["logit_bias"], **bias}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        text, finish = choice.message.content, choice.finish_reason
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), schema)


def test_regex_extra(client, sample):
    pattern = r"(yes|no), [0-9]{1,3} (cats|dogs)\."
    for seed in range(3):
        resp = client.chat.completions.create(
            model=MODEL, messages=ASK, seed=seed, extra_body={"regex": pattern}, **sample
        )
        assert re.fullmatch(pattern, resp.choices[0].message.content)
        assert resp.choices[0].finish_reason == "stop"


# A template that renders tools, assistant calls (arguments through tojson) and tool results.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, "
    "'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}"
    "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)


def test_conversation_with_a_tool_result(client, server):  # noqa: F811
    engine = server[0]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"},
    ]
    resp = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=tools,
        max_tokens=4,
        extra_body={"chat_template_kwargs": {"chat_template": TOOL_TEMPLATE}},
    )
    rendered = messages[:1] + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                }
            ],
        },
        messages[2],
    ]
    text = engine.tokenizer.apply_chat_template(
        rendered, tools=tools, chat_template=TOOL_TEMPLATE, tokenize=False
    )
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}' in text
    assert "12 C, rain (call_1)" in text and '"name": "f"' in text
    assert resp.usage.prompt_tokens == len(engine.tokenizer.encode(text, add_special_tokens=False))
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert plain.usage.prompt_tokens == len(
        template_ids(engine, [messages[0], {"role": "assistant", "content": ""}, messages[2]])
    )


BAD_TOOL_INPUTS = [
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
        "'nope', which is not in tools",
    ),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'required'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice", '"name"'),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    (
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
            ]
        },
        "tools[0].function.parameters",
        "not a valid JSON schema",
    ),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type", "'function'"),
    (
        {"tools": [{"type": "function", "function": {"name": "a b"}}]},
        "tools[0].function.name",
        "must match",
    ),
    ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name", "given twice"),
    (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
        "cannot be combined",
    ),
    (
        {"response_format": {"type": "json_object"}, "regex": "a+"},
        "response_format",
        "cannot be combined",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "response_format.json_schema",
        '"name"',
    ),
    ({"response_format": {"type": "xml"}}, "response_format.type", "'json_schema'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "tool_call_id"),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{oops"}}
                    ],
                }
            ]
        },
        "messages[0].tool_calls[0].function.arguments",
        "JSON",
    ),
]


@pytest.mark.parametrize(
    "extra,param,words", BAD_TOOL_INPUTS, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_TOOL_INPUTS)]
)
def test_bad_tool_input_is_a_400_naming_the_field(server, extra, param, words):  # noqa: F811
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, **extra}
    resp = httpx.post(f"{server[1]}/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and words in error["message"], error
