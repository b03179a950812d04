"""Hostile single requests against the shared server: none of them may take the server down.

A constraint that can never be satisfied is a 400 naming its field where xgrammar can tell
before the request is queued; one that fails midway (min_new_tokens bans the end of sequence,
the only continuation a finished grammar allows) ends that request alone with finish reason
abort and a message, while a greedy request running beside it says exactly what it says alone.
Schemas nested thousands deep, top_logprobs_num the size of the vocabulary, logprob requests
that would produce millions of entries, prompts past --max-prompt-chars and batches past
--max-request-batch-size are 400s naming the field. After each test /health answers 200 and no
request holds a token.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

TIMEOUT = httpx.Timeout(120.0)
GREEDY = {
    "text": "The capital of France is",
    "sampling_params": {"temperature": 0, "max_new_tokens": 16},
}
# Each ends alone, midway, with finish reason abort: (route, body, words its message holds).
MIDWAY = [
    ("/v1/completions", {"prompt": "Say:", "max_tokens": 8, "min_tokens": 5, "regex": "a"}, None),
    (
        "/generate",
        {
            "text": "Say:",
            "sampling_params": {"max_new_tokens": 8, "min_new_tokens": 5, "regex": "a"},
        },
        ("min_new_tokens=5", "regex"),
    ),
    (
        "/generate",
        {
            "text": "Say:",
            "sampling_params": {"max_new_tokens": 8, "min_new_tokens": 6, "regex": "\U0001f600"},
        },
        ("min_new_tokens=6", "regex"),
    ),
    (
        "/generate",
        {"text": "Say:", "sampling_params": {"max_new_tokens": 8, "regex": "a\u0016"}},
        ("regex", "allows no token"),
    ),
    (
        "/generate",
        {
            "text": "Say:",
            "stream": True,
            "sampling_params": {"max_new_tokens": 8, "min_new_tokens": 5, "regex": "a"},
        },
        ("min_new_tokens=5",),
    ),
]


def post(server, route: str, body: dict | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(
        server.url + route,
        content=content,
        timeout=TIMEOUT,
        headers={**server.headers, "Content-Type": "application/json"},
    )


def assert_400(response: httpx.Response, param: str, *words: str) -> None:
    assert response.status_code == 400, (response.status_code, response.text[:500])
    error = response.json()["error"]
    assert error["param"] == param, error
    for word in words:
        assert word in error["message"], error


def finish_of(route: str, response: httpx.Response) -> dict | str:
    """The finish reason of a native answer (a stream: its last chunk), or an OpenAI one's."""
    assert response.status_code == 200, (response.status_code, response.text[:500])
    if route.startswith("/v1"):
        return response.json()["choices"][0]["finish_reason"]
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        return json.loads(events[-2])["meta_info"]["finish_reason"]
    return response.json()["meta_info"]["finish_reason"]


def test_a_constraint_no_token_can_start_is_a_400_naming_it(pool_conserved):
    server = pool_conserved
    assert_400(
        post(
            server,
            "/generate",
            {"text": "Say:", "sampling_params": {"max_new_tokens": 8, "regex": "\u0016"}},
        ),
        "regex",
        "can never be satisfied",
    )
    assert_400(
        post(
            server,
            "/generate",
            {
                "text": "Say:",
                "sampling_params": {"max_new_tokens": 8, "ebnf": 'root ::= "\\x16" [a-z]*'},
            },
        ),
        "ebnf",
        "can never be satisfied",
    )
    assert_400(
        post(server, "/v1/completions", {"prompt": "Say:", "max_tokens": 8, "regex": "\u0016"}),
        "regex",
    )
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_requests_that_cannot_go_on_end_alone_and_the_others_are_unchanged(pool_conserved):
    server = pool_conserved
    alone = post(server, "/generate", GREEDY).json()
    with ThreadPoolExecutor(len(MIDWAY) + 1) as pool:
        beside = pool.submit(post, server, "/generate", GREEDY)
        hostile = [pool.submit(post, server, route, body) for route, body, _ in MIDWAY]
        answers = [f.result() for f in hostile]
        beside = beside.result()
    for (route, body, words), answer in zip(MIDWAY, answers, strict=True):
        reason = finish_of(route, answer)
        if route.startswith("/v1"):
            assert reason == "abort", (body, reason)
            continue
        assert reason["type"] == "abort", (body, reason)
        for word in words:
            assert word in reason["message"], (body, reason)
    assert beside.status_code == 200, beside.text[:500]
    assert beside.json()["output_ids"] == alone["output_ids"]
    assert beside.json()["meta_info"]["finish_reason"] == alone["meta_info"]["finish_reason"]


@pytest.mark.parametrize("depth", [1500, 20000])
def test_a_deeply_nested_schema_is_a_400_not_a_recursion_error(pool_conserved, depth):
    server = pool_conserved
    schema = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
    as_text = {"text": "x", "sampling_params": {"max_new_tokens": 4, "json_schema": schema}}
    assert_400(post(server, "/generate", as_text), "json_schema")
    arrays = '{"enum": ' + "[" * depth + "]" * depth + "}"  # short enough for the size cap
    assert_400(
        post(
            server,
            "/generate",
            {"text": "x", "sampling_params": {"max_new_tokens": 4, "json_schema": arrays}},
        ),
        "json_schema",
        "levels deep",
    )
    # The schema as an object inside the body: refused whole (the body nests too deeply) or
    # by its field, but a 400 either way, never a RecursionError.
    as_dict = (
        '{"text": "x", "sampling_params": {"max_new_tokens": 4, "json_schema": ' + schema + "}}"
    )
    answer = post(server, "/generate", as_dict)
    assert answer.status_code == 400 and "Recursion" not in answer.text, answer.text[:300]
    answer = post(
        server,
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": '
        '"x"}], "max_tokens": 4, "response_format": {"type": "json_schema", '
        '"json_schema": {"name": "x", "schema": ' + schema + "}}}",
    )
    assert answer.status_code == 400 and "Recursion" not in answer.text, answer.text[:300]


def test_a_body_nested_past_the_limit_names_the_field_it_is_in(pool_conserved):
    # 200 levels: past the server's 128, within what json.loads parses (so the path is known).
    schema = '{"type": "array", "items": ' * 200 + '{"type": "string"}' + "}" * 200
    native = (
        '{"text": "x", "sampling_params": {"max_new_tokens": 4, "json_schema": ' + schema + "}}"
    )
    assert_400(
        post(pool_conserved, "/generate", native),
        "sampling_params.json_schema",
        "nested too deeply",
    )
    chat = (
        '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, '
        '"response_format": {"type": "json_schema", "json_schema": {"name": "x", '
        '"schema": ' + schema + "}}}"
    )
    assert_400(
        post(pool_conserved, "/v1/chat/completions", chat),
        "response_format.json_schema",
        "nested too deeply",
    )


def test_logprob_requests_are_bounded(pool_conserved):
    server = pool_conserved
    prompt = " ".join(["word"] * 64)
    assert_400(
        post(
            server,
            "/generate",
            {
                "text": prompt,
                "return_logprob": True,
                "logprob_start_len": 0,
                "top_logprobs_num": 49152,
                "sampling_params": {"max_new_tokens": 1},
            },
        ),
        "top_logprobs_num",
        "[0, 20]",
        "--max-logprobs",
        "49152",
    )
    # 20,000 ids at (64 prompt + 100 new) positions: 3.3M entries, over the 1M default.
    assert_400(
        post(
            server,
            "/generate",
            {
                "text": prompt,
                "return_logprob": True,
                "logprob_start_len": 0,
                "token_ids_logprob": list(range(20000)),
                "sampling_params": {"max_new_tokens": 100},
            },
        ),
        "token_ids_logprob",
        "--max-logprob-entries",
    )
    assert_400(
        post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "logprobs": 49152}),
        "logprobs",
    )
    ok = post(
        server,
        "/generate",
        {
            "text": prompt,
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 20,
            "sampling_params": {"max_new_tokens": 2},
        },
    )
    assert ok.status_code == 200, ok.text[:300]
    meta = ok.json()["meta_info"]
    assert all(len(top) == 20 for top in meta["input_top_logprobs"][1:])
    assert len(ok.content) < 1_000_000


def test_prompt_length_and_batch_size_are_bounded(pool_conserved):
    server = pool_conserved
    assert_400(
        post(
            server, "/generate", {"text": "a" * 1_000_001, "sampling_params": {"max_new_tokens": 1}}
        ),
        "text",
        "1000001 characters",
        "--max-prompt-chars",
    )
    assert_400(
        post(server, "/generate", {"text": ["a"] * 1025, "sampling_params": {"max_new_tokens": 1}}),
        "text",
        "1025 prompts",
        "--max-request-batch-size",
    )
    assert_400(
        post(
            server,
            "/generate",
            {"input_ids": [[1]] * 1025, "sampling_params": {"max_new_tokens": 1}},
        ),
        "input_ids",
        "--max-request-batch-size",
    )
    assert_400(
        post(
            server,
            "/generate",
            {"text": ["a"] * 9, "sampling_params": {"max_new_tokens": 1, "n": 128}},
        ),
        "n",
        "1152 requests",
    )
