"""OpenAI error semantics as clients read them (issue 13, "Clients"): the `openai` client's
NotFoundError for an unknown model, BadRequestError with code "context_length_exceeded" for a
prompt or max_tokens beyond the context, litellm's ContextWindowExceededError for the same,
and a string `code` in every error the server sends. Over the shared default server."""

from __future__ import annotations

import os

import httpx
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
CONTEXT_WORDS = "This model's maximum context length is"  # OpenAI's words, litellm's key


@pytest.fixture(scope="module")
def context(oai) -> int:
    return oai.models.retrieve(MODEL).max_model_len


def _too_long(context: int) -> str:
    return " hello" * (context + 10)  # at least one token per word


def _assert_context_error(err: openai.BadRequestError, param: str) -> None:
    assert err.status_code == 400 and err.code == "context_length_exceeded", err
    assert CONTEXT_WORDS in err.message and err.param == param, err


def test_an_unknown_model_is_not_found(oai):
    with pytest.raises(openai.NotFoundError) as err:
        oai.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert err.value.code == "model_not_found" and err.value.param == "model"
    with pytest.raises(openai.NotFoundError) as err:
        oai.completions.create(model="gpt-4o", prompt="hi", max_tokens=1)
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as err:
        oai.models.retrieve("gpt-4o")
    assert err.value.code == "model_not_found"
    assert oai.models.retrieve(MODEL).id == MODEL


def test_a_prompt_beyond_the_context_is_context_length_exceeded(oai, context):
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": _too_long(context)}]
        )
    _assert_context_error(err.value, "messages")
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model=MODEL, prompt=_too_long(context), max_tokens=1)
    _assert_context_error(err.value, "prompt")
    with pytest.raises(openai.BadRequestError) as err:  # token ids
        oai.completions.create(model=MODEL, prompt=[1] * context, max_tokens=1)
    _assert_context_error(err.value, "prompt")


def test_max_tokens_beyond_the_context_is_context_length_exceeded(oai, context):
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=hi, max_tokens=context)
    _assert_context_error(err.value, "max_tokens")
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=hi, max_completion_tokens=context)
    _assert_context_error(err.value, "max_completion_tokens")
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=context)
    _assert_context_error(err.value, "max_tokens")
    # Other bad requests are plain 400s, with a code of their own.
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=1, temperature=-1)
    assert err.value.code == "invalid_request" and err.value.param == "temperature"


def test_litellm_maps_an_over_long_prompt_to_context_window_exceeded(server, context):
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no network here
    litellm = pytest.importorskip("litellm")
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(
            model=f"openai/{MODEL}",
            api_base=server.url + "/v1",
            api_key="unused",
            messages=[{"role": "user", "content": _too_long(context)}],
            num_retries=0,
        )
    with pytest.raises(litellm.NotFoundError):
        litellm.completion(
            model="openai/gpt-4o",
            api_base=server.url + "/v1",
            api_key="unused",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1,
            num_retries=0,
        )


ERRORS = [  # (method, path, body): every kind of error the OpenAI layer answers
    ("POST", "/v1/chat/completions", b"{not json"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}),
    ("POST", "/v1/completions", {"model": "nope", "prompt": "x"}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**6}),
    ("GET", "/v1/models/nope", None),
    ("GET", "/v1/no_such_route", None),
    ("GET", "/v1/chat/completions", None),  # 405
]


@pytest.mark.parametrize("method,path,body", ERRORS, ids=[f"{m} {p}" for m, p, _ in ERRORS])
def test_every_error_code_is_a_string(server, method, path, body):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    resp = httpx.request(method, server.url + path, timeout=30, **({} if body is None else kwargs))
    assert resp.status_code >= 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["code"], str) and error["code"], error


def test_native_generate_says_maximum_context_length_too(server, context):
    resp = httpx.post(
        server.url + "/generate",
        json={"input_ids": [1] * 3, "sampling_params": {"max_new_tokens": context}},
        timeout=30,
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert CONTEXT_WORDS in error["message"] and error["code"] == "context_length_exceeded"
