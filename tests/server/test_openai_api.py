"""The OpenAI-compatible routes on a real uvicorn server (loopback, tiny random model) with
the `openai` client: the happy paths (bad input and clients that leave: test_openai_errors.py).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import openai
import pytest
import uvicorn
from fastapi import FastAPI

from radixrt import Engine
from radixrt.entrypoints.openai.api import add_openai_routes

MODEL = "tiny"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name three colors."},
]
GREEDY = {"temperature": 0, "max_tokens": 12}


@contextmanager
def serve(engine: Engine) -> Iterator[str]:
    """The OpenAI routes over `engine` on uvicorn (loopback, a free port): yields the base URL;
    shuts the engine down at the end."""
    app = FastAPI()
    add_openai_routes(app, engine, MODEL)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        sock.close()
        engine.shutdown()


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    engine = Engine(
        tiny_model_dir("llama"),
        in_process=True,
        dtype="float32",
        max_total_tokens=4096,
        log_level="warning",
    )
    with serve(engine) as url:
        yield engine, url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[1]}/v1", api_key="x", max_retries=0)


def template_ids(engine, messages) -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return engine.tokenizer.encode(text, add_special_tokens=False)


def test_models_lists_the_served_name(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_greedy_chat_matches_the_engine(client, server):
    engine = server[0]
    resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    ids = template_ids(engine, MESSAGES)
    assert engine.tokenizer.decode(ids[:1]) == "<|im_start|>"  # no BOS before the template
    want = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 12})
    choice = resp.choices[0]
    assert (
        resp.id.startswith("chatcmpl-") and resp.model == MODEL and resp.object == "chat.completion"
    )
    assert choice.message.role == "assistant" and choice.message.content == want["text"]
    assert choice.finish_reason == want["meta_info"]["finish_reason"]["type"]
    assert resp.usage.prompt_tokens == len(ids)
    assert resp.usage.completion_tokens == len(want["output_ids"])
    assert resp.usage.total_tokens == len(ids) + len(want["output_ids"])
    # The same prompt again: its prefix is in the radix cache.
    again = client.chat.completions.create(model="default", messages=MESSAGES, **GREEDY)
    assert again.choices[0].message.content == want["text"]
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_content_parts_equal_plain_content(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name three colors."}]}]
    plain = [{"role": "user", "content": "Name three colors."}]
    a = client.chat.completions.create(model=MODEL, messages=parts, **GREEDY)
    b = client.chat.completions.create(model=MODEL, messages=plain, **GREEDY)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_streaming_chat_with_usage(client):
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == full.choices[0].finish_reason and not any(finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_n_and_seed(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=2, seed=7, temperature=1.0, max_completion_tokens=8
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.usage.completion_tokens <= 16
    again = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=2, seed=7, temperature=1.0, max_completion_tokens=8
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in resp.choices]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=2,
        seed=7,
        temperature=1.0,
        max_completion_tokens=8,
        stream=True,
    )
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in resp.choices]


def test_beam_search_fields_as_vllm_names_them(client, server):
    """use_beam_search keeps n beams and returns every one, best first, as vLLM does; what
    beam search does not take is a 400 naming the field."""
    engine = server[0]
    body = {"use_beam_search": True, "length_penalty": 0.5, "early_stopping": True}
    resp = client.completions.create(
        model=MODEL, prompt="Once upon", n=3, max_tokens=10, temperature=0, extra_body=body
    )
    want = engine.generate(
        "Once upon",
        {"beam_width": 3, "n": 3, "max_new_tokens": 10, "temperature": 0, "length_penalty": 0.5,
         "early_stopping": True},
    )  # fmt: skip
    assert [c.text for c in resp.choices] == [w["text"] for w in want]
    assert [c.index for c in resp.choices] == [0, 1, 2]
    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=2, max_tokens=8, extra_body={"use_beam_search": True}
    )
    assert len(chat.choices) == 2
    for bad, param in [({"stream": True}, "stream"), ({"temperature": 0.7}, "temperature")]:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(
                model=MODEL,
                prompt="Once upon",
                n=2,
                max_tokens=8,
                extra_body={"use_beam_search": True},
                **bad,
            )
        assert err.value.body["param"] == param


def test_stop_string(client):
    params = {"temperature": 0, "max_tokens": 30, "extra_body": {"ignore_eos": True}}
    full = client.completions.create(model=MODEL, prompt="Hello there", **params)
    text = full.choices[0].text
    # The tiny model says random bytes: stop at the first plain-ASCII pair after the start.
    stop = next(
        (
            text[k : k + 2]
            for k in range(1, len(text) - 1)
            if text[k : k + 2].isascii()
            and text[k : k + 2].isprintable()
            and text.index(text[k : k + 2]) == k
        ),
        None,
    )
    assert stop, f"no ASCII stop string to pick in {text!r}"
    cut = client.completions.create(model=MODEL, prompt="Hello there", stop=[stop], **params)
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert full.choices[0].finish_reason == "length"


def test_chat_logprobs(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)
        assert entry.token == entry.top_logprobs[0].token
        assert bytes(entry.bytes).decode(errors="replace") == entry.token


def test_token_bytes_are_exact(server):
    from radixrt.entrypoints.openai.stream import TokenTexts

    tok = server[0].tokenizer
    texts = TokenTexts(tok)
    text = "naïve € <|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(texts.get(i)[1] for i in ids) == text.encode()
    assert texts.get(ids[-1])[0] == "<|im_end|>"


def test_completion_logprobs_and_echo(client, server):
    engine = server[0]
    prompt = "The sky is"
    resp = client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=2, temperature=0, max_tokens=5
    )
    choice = resp.choices[0]
    assert resp.id.startswith("cmpl-") and choice.text.startswith(prompt)
    n_prompt = len(engine.tokenizer.encode(prompt))
    lp = choice.logprobs
    assert len(lp.tokens) == n_prompt + 5 == len(lp.token_logprobs) == len(lp.text_offset)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(len(t) <= 2 for t in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset[n_prompt] == len(prompt)
    plain = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=5)
    assert choice.text == prompt + plain.choices[0].text


def test_completion_prompt_shapes(client, server):
    tok = server[0].tokenizer
    a, b = "One two", "Three four five"
    by_text = client.completions.create(model=MODEL, prompt=[a, b], **GREEDY)
    by_ids = client.completions.create(model=MODEL, prompt=[tok.encode(a), tok.encode(b)], **GREEDY)
    single = client.completions.create(model=MODEL, prompt=tok.encode(b), **GREEDY)
    texts = [c.text for c in by_text.choices]
    assert texts == [c.text for c in by_ids.choices] and texts[1] == single.choices[0].text
    assert by_text.usage.prompt_tokens == len(tok.encode(a)) + len(tok.encode(b))
    stream = client.completions.create(model=MODEL, prompt=[a, b], stream=True, **GREEDY)
    streamed = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts


def test_default_max_tokens_and_extra_fields(client):
    resp = client.completions.create(
        model=MODEL,
        prompt="Hi",
        temperature=0,
        extra_body={"ignore_eos": True, "top_k": 5, "some_future_field": 1},
    )
    assert resp.usage.completion_tokens == 16  # the OpenAI default for completions
    resp = client.completions.create(
        model=MODEL,
        prompt="Hi",
        temperature=0,
        max_tokens=6,
        extra_body={"ignore_eos": True, "min_tokens": 6},
    )
    assert resp.usage.completion_tokens == 6
