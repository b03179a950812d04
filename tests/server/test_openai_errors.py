"""The OpenAI-compatible routes on bad input (httpx: a 400 naming the field, for each kind; an
unknown model's 404) and on clients that leave a stream, over test_openai_api.py's server."""

from __future__ import annotations

import time

import httpx
import pytest
import test_openai_api
from test_openai_api import MESSAGES, MODEL

# Its fixtures: a server of this module's own (module scope), and its openai client.
server = test_openai_api.server
client = test_openai_api.client

BAD_INPUTS = [
    ("completions", "{not json", None, "JSON"),
    ("completions", [1, 2], None, "object"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, "max_tokens", "int"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens", ">= 1"),
    (
        "completions",
        {"model": MODEL, "prompt": "x", "max_tokens": 100000},
        "max_tokens",
        "context length",
    ),
    ("completions", {"model": MODEL, "prompt": "x" * 600}, "prompt", "context length"),
    ("completions", {"model": MODEL}, "prompt", "required"),
    ("completions", {"model": MODEL, "prompt": []}, "prompt", "empty"),
    ("completions", {"model": MODEL, "prompt": [5, 99999]}, "prompt", "token id"),
    (
        "completions",
        {"model": MODEL, "prompt": [[5], [-1]], "echo": True},
        "prompt",
        "prompt[1][0] = -1 is not a token id",
    ),
    ("completions", {"model": MODEL, "prompt": "x", "n": 0}, "n", ">= 1"),
    ("completions", {"model": MODEL, "prompt": "x", "temperature": -1}, "temperature", ">= 0"),
    ("completions", {"model": MODEL, "prompt": "x", "top_p": 2}, "top_p", "(0, 1]"),
    ("completions", {"model": MODEL, "prompt": "x", "logprobs": 21}, "logprobs", "20"),
    ("completions", {"model": MODEL, "prompt": "x", "stop": 3}, "stop", "string"),
    (
        "completions",
        {"model": MODEL, "prompt": "x", "min_tokens": 9, "max_tokens": 2},
        "min_tokens",
        "max_tokens",
    ),
    (
        "completions",
        {"model": MODEL, "prompt": "x", "regex": "(a+"},
        "regex",
        "not a valid regular expression",
    ),
    ("chat/completions", {"model": MODEL}, "messages", "required"),
    ("chat/completions", {"model": MODEL, "messages": []}, "messages", "at least 1"),
    (
        "chat/completions",
        {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
        "messages[0].role",
        "'user'",
    ),
    (
        "chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
        "messages[0].content",
        "string",
    ),
    (
        "chat/completions",
        {
            "model": MODEL,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        "messages[0].content[0].type",
        "text",
    ),
    (
        "chat/completions",
        {"model": MODEL, "messages": MESSAGES, "top_logprobs": 30, "logprobs": True},
        "top_logprobs",
        "20",
    ),
    (
        "chat/completions",
        {"model": MODEL, "messages": MESSAGES, "top_logprobs": 2},
        "top_logprobs",
        "logprobs",
    ),
    (
        "chat/completions",
        {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": 1000},
        "max_completion_tokens",
        "context length",
    ),
    (
        "chat/completions",
        {"model": MODEL, "messages": MESSAGES, "presence_penalty": 3},
        "presence_penalty",
        "[-2.0, 2.0]",
    ),
    (
        "chat/completions",
        {
            "model": MODEL,
            "messages": MESSAGES,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nope"}},
            },
        },
        "response_format",
        "not a valid JSON schema",
    ),
]


@pytest.mark.parametrize(
    "path,body,param,words", BAD_INPUTS, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD_INPUTS)]
)
def test_bad_input_is_a_400_naming_the_field(server, path, body, param, words):
    url = f"{server[1]}/v1/{path}"
    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
    resp = httpx.post(url, timeout=30, **kwargs)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    assert words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_unknown_model_is_a_404(server):
    resp = httpx.post(
        f"{server[1]}/v1/completions", json={"model": "gpt-4", "prompt": "x"}, timeout=30
    )
    assert resp.status_code == 404, resp.text
    error = resp.json()["error"]
    assert error["param"] == "model" and error["code"] == "model_not_found", error
    assert "'gpt-4'" in error["message"] and MODEL in error["message"]


def test_still_serving_after_bad_input(server, client):
    for body in ({"prompt": "x", "max_tokens": "ten"}, {"prompt": [99999]}):
        assert httpx.post(f"{server[1]}/v1/completions", json=body).status_code == 400
    resp = client.completions.create(model=MODEL, prompt="Still there?", max_tokens=3)
    assert resp.usage.completion_tokens >= 1
    stats = server[0].get_stats(check_kv=True)
    assert stats["protected_tokens"] == 0


def test_client_leaving_a_stream_aborts_it(server):
    engine, base = server
    before = engine.get_stats()["generated_tokens"]
    body = {"prompt": "Tell a long story", "max_tokens": 480, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as resp:
        events = (line for line in resp.iter_lines() if line.startswith("data:"))
        next(events), next(events)
    deadline = time.monotonic() + 10
    while engine.get_stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = engine.get_stats(check_kv=True)
    assert stats["running"] == 0 and stats["protected_tokens"] == 0
    assert stats["generated_tokens"] - before < 480, "the request ran to its end"
