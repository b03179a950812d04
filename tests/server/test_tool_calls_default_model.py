"""Tool calls on the run's shared default-model server (SmolLM2-135M, greedy) with the `openai`
client, where a real model's choices matter: "required" with one tool is the named call
(pydantic-ai's output tool), "auto" constrains the call the model opens (a structural tag),
and the native /generate takes SGLang's `structural_tag`. SmolLM2's template does not render
tools, so the conversations show the model the Hermes call format by example."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from radixrt.entrypoints.openai.tool_calls import hermes_call_tag
from radixrt.entrypoints.openai.tool_parsers import parse_tool_calls

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 32},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
# pydantic-ai's output tool: one tool, tool_choice "required".
ANSWER = {
    "type": "object",
    "properties": {"capital": {"type": "string", "maxLength": 32}, "country": {"type": "string"}},
    "required": ["capital", "country"],
    "additionalProperties": False,
}
FINAL = {"type": "function", "function": {"name": "final_result", "parameters": ANSWER}}
EXAMPLE_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    "\n</tool_call>"
)
# The model is shown one call and asked again: it opens a call of its own.
FEW_SHOT = [
    {
        "role": "system",
        "content": "To call a tool, write <tool_call> followed by a JSON object with the name "
        "and arguments, then </tool_call>.",
    },
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": EXAMPLE_CALL},
    {"role": "user", "content": "What is the weather in Oslo?"},
]


@pytest.fixture(scope="module")
def default_oai(default_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key="x", max_retries=0)


def _args(call, name: str, schema: dict) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema)
    return args


def test_required_with_one_tool_is_the_named_call(default_oai):
    """The arguments are the function's own, not a {"name", "arguments"} wrapper (which a
    small model copies into them); streamed, the same call."""
    kwargs = {
        "model": "default",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "tools": [FINAL],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 64,
    }
    choice = default_oai.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    args = _args(choice.message.tool_calls[0], "final_result", ANSWER)
    assert set(args) == {"capital", "country"}
    streamed = {"name": None, "arguments": ""}
    for chunk in default_oai.chat.completions.create(stream=True, **kwargs):
        for delta in chunk.choices[0].delta.tool_calls or []:
            assert delta.index == 0
            streamed["name"] = streamed["name"] or delta.function.name
            streamed["arguments"] += delta.function.arguments or ""
    want = choice.message.tool_calls[0].function
    assert streamed == {"name": want.name, "arguments": want.arguments}


def test_auto_call_the_model_opens_is_constrained(default_oai):
    """The model copies the example's format; under the structural tag its call must follow
    the schema (`unit` one of the enum, no other keys) and close, so it parses."""
    resp = default_oai.chat.completions.create(
        model="default", tools=[TOOL], temperature=0, max_tokens=64, messages=FEW_SHOT
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    args = _args(call, "get_weather", WEATHER)
    assert "oslo" in args["city"].lower()


def _generate(server, sampling_params: dict, text: str = "The weather in Paris:") -> httpx.Response:
    body = {"text": text, "sampling_params": {"temperature": 0, **sampling_params}}
    return httpx.post(server.url + "/generate", json=body, timeout=120)


def _jump_forward_tokens(server) -> int:
    return httpx.get(server.url + "/get_server_info", timeout=30).json()["jump_forward_tokens"]


def test_generate_takes_a_structural_tag(default_server):
    """xgrammar's shape with at_least_one forces a call at once; SGLang's original shape
    (structures / triggers) lets free text through. Both under jump-forward."""
    city = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
    }
    tag = hermes_call_tag({"get_weather": city}, parallel=False)
    tag["format"]["at_least_one"] = True
    # An example in the prompt, so the model writes the forced text in its usual tokens (a
    # text it would not write comes out in many small ones, each a step).
    example = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    sampling = {"structural_tag": tag, "max_new_tokens": 48}
    jumped = _jump_forward_tokens(default_server)
    out = _generate(default_server, sampling, f"Calls:\n{example}\n")
    assert _jump_forward_tokens(default_server) > jumped  # the forced begin, proposed
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["meta_info"]["finish_reason"]["type"] == "stop", body
    (call,) = parse_tool_calls(body["text"]).calls
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), city)
    original = {
        "type": "structural_tag",
        "structures": [
            {
                "begin": '<tool_call>\n{"name": "get_weather", "arguments": ',
                "schema": WEATHER,
                "end": "}\n</tool_call>",
            }
        ],
        "triggers": ["<tool_call>"],
    }
    free = _generate(
        default_server,
        {"structural_tag": json.dumps(original), "max_new_tokens": 8},
        "Q: What is the capital of France?\nA:",
    )
    assert free.status_code == 200, free.text
    assert "Paris" in free.json()["text"]


@pytest.mark.parametrize(
    "tag,words",
    [
        ({"type": "structural_tag", "triggers": ["<a"]}, "allowed:"),
        (
            {
                "structures": [{"begin": "<a>", "schema": {"type": "no"}, "end": "</a>"}],
                "triggers": ["<a"],
            },
            "invalid JSON schema at structures[0].schema",
        ),
    ],
)
def test_generate_refuses_a_bad_structural_tag_by_name(default_server, tag, words):
    resp = _generate(default_server, {"structural_tag": tag, "max_new_tokens": 4})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "structural_tag" and words in error["message"], error
