"""POST /v1/responses (OpenAI's Responses API) through the `openai` client against the shared
default-model server: text and message inputs, usage against the chat path's prompt, the
stream's events in order, json_schema output, a forced function call and its follow-up over
previous_response_id (with cached tokens from the radix cache), store: false, and errors
that name the Responses field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from radixrt.entrypoints.openai.responses import ResponseStore, StoredResponse
from radixrt.errors import APIError

MODEL = "default"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
# Short values: a 135M model left free writes text until max_output_tokens.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"thing": {"type": "string", "maxLength": 12}, "wet": {"type": "boolean"}},
    "required": ["thing", "wet"],
    "additionalProperties": False,
}


def test_text_input_gives_text_and_the_chat_prompts_usage(oai):
    resp = oai.responses.create(
        model=MODEL, input="Name a fruit.", max_output_tokens=6, temperature=0
    )
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output_text.strip()
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"
    chat = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a fruit."}],
        max_tokens=6,
        temperature=0,
    )
    usage = resp.usage
    assert usage.input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert resp.output_text == chat.choices[0].message.content  # greedy: the same answer
    if chat.choices[0].finish_reason == "length":
        assert resp.status == "incomplete"
        assert resp.incomplete_details.reason == "max_output_tokens"


def test_message_list_with_instructions_matches_the_chat_prompt(oai):
    messages = [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Say yes."}]},
    ]
    resp = oai.responses.create(
        model=MODEL,
        instructions="Answer in one word.",
        input=messages,
        max_output_tokens=5,
        temperature=0,
    )
    chat = oai.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Say yes."},
        ],
        max_tokens=5,
        temperature=0,
    )
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.output_text == chat.choices[0].message.content
    assert resp.instructions == "Answer in one word."


MESSAGE_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def _collapsed(kinds: list[str]) -> list[str]:
    return [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]


def test_stream_helper_gives_the_events_in_order_and_the_final_response(oai):
    with oai.responses.stream(
        model=MODEL, input="Count to five.", max_output_tokens=8, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert _collapsed(kinds) == MESSAGE_EVENTS
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed and final.output_text == streamed
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == streamed
    assert final.usage.output_tokens > 0 and final.id == events[0].response.id


def test_raw_stream_numbers_its_events(oai):
    stream = oai.responses.create(
        model=MODEL, input="Say hello.", max_output_tokens=4, temperature=0, stream=True
    )
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.status in ("completed", "incomplete")


def test_json_schema_format_gives_json_of_the_schema(oai):
    resp = oai.responses.create(
        model=MODEL,
        input="Is water wet?",
        max_output_tokens=60,
        temperature=0,
        text={
            "format": {
                "type": "json_schema",
                "name": "answer",
                "schema": ANSWER_SCHEMA,
                "strict": True,
            }
        },
    )
    jsonschema.validate(json.loads(resp.output_text), ANSWER_SCHEMA)
    assert resp.text.format.type == "json_schema"


def test_forced_function_call_then_its_output_over_previous_response_id(oai):
    first = oai.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    second = oai.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny."}],
        tools=[WEATHER_TOOL],
        max_output_tokens=4,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    # The second prompt starts with the first one, whose KV the radix cache kept.
    cached = second.usage.input_tokens_details.cached_tokens
    assert first.usage.input_tokens <= cached < second.usage.input_tokens
    assert oai.responses.retrieve(first.id).output[0].call_id == calls[0].call_id


def test_stream_of_a_forced_call_sends_argument_events(oai):
    with oai.responses.stream(
        model=MODEL,
        input="Weather in Rome?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = _collapsed([e.type for e in events])
    assert kinds[2:5] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ]
    call = final.output[0]
    assert call.type == "function_call" and json.loads(call.arguments)["city"]


def test_a_response_not_stored_cannot_be_continued_or_retrieved(oai):
    resp = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(
            model=MODEL, input="Again", max_output_tokens=2, previous_response_id=resp.id
        )
    assert err.value.body["param"] == "previous_response_id"
    assert err.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(resp.id)


def test_a_stored_response_can_be_deleted(oai, server):
    resp = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    assert oai.responses.retrieve(resp.id).id == resp.id
    gone = httpx.delete(f"{server.url}/v1/responses/{resp.id}", timeout=10)
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(resp.id)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0]"),
        ({"max_output_tokens": 10**7}, "max_output_tokens"),
    ],
)
def test_bad_requests_name_the_responses_field(oai, extra, param):
    args = {"model": MODEL, "input": "Hi", "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(**args)
    assert err.value.body["param"].startswith(param), err.value.body


def test_an_unknown_model_is_a_404(oai):
    with pytest.raises(openai.NotFoundError) as err:
        oai.responses.create(model="no-such-model", input="Hi", max_output_tokens=2)
    assert err.value.body["code"] == "model_not_found"


def test_the_store_keeps_the_most_recent_and_rebuilds_chains():
    store = ResponseStore(capacity=2)
    store.put("a", StoredResponse({}, [{"role": "user", "content": "1"}], None))
    store.put("b", StoredResponse({}, [{"role": "user", "content": "2"}], "a"))
    assert [m["content"] for m in store.conversation("b")] == ["1", "2"]
    store.get("b")  # "a" is now the least recently used
    store.put("c", StoredResponse({}, [], None))
    assert store.get("a") is None and store.get("c") is not None
    with pytest.raises(APIError) as err:
        store.conversation("b")  # its first turn is gone
    assert err.value.param == "previous_response_id"
    assert err.value.code == "previous_response_not_found" and "'a'" in err.value.message


def test_each_sse_event_carries_its_name(server):
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as reply:
        blocks = [b for b in reply.read().decode().split("\n\n") if b.strip()]
    assert blocks[-1] == "data: [DONE]"
    for block in blocks[:-1]:
        data, name = block.split("\n")
        assert name == "event: " + json.loads(data.removeprefix("data: "))["type"]
