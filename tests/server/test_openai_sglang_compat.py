"""The OpenAI layer where SGLang's own server tests (test/srt/openai_server/basic/
test_openai_server.py) and OpenAI's clients look, against a real `radixrt launch` (default
model, float32): model retrieval and unknown models, the chunk shapes of streamed completions
and chats for every combination of echo, logprobs, list prompts, n and token prompts (each
checked against the same request unstreamed), SGLang's `reasoning_content`, and
continue_final_message."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from itertools import product

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"
PROMPT_IDS = [504, 3575, 282, 4649, 314]  # PROMPT in SmolLM2's tokenizer (no BOS)
SYSTEM = {"role": "system", "content": "You are a helpful AI assistant"}
ASK = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{path}", json=body, timeout=120)


def events(server, path: str, body: dict) -> list[dict]:
    """The JSON events of a streamed request, up to [DONE] (which must come)."""
    out = []
    with httpx.stream(
        "POST", f"{server.url}/v1/{path}", json={**body, "stream": True}, timeout=120
    ) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return out
            out.append(json.loads(line[len("data: ") :]))
    raise AssertionError(f"the stream ended without [DONE] after {len(out)} events")


def counts(usage: dict) -> tuple[int, int, int]:
    """Usage without cached_tokens (which depends on what earlier requests left cached)."""
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


# -- models ----------------------------------------------------------------------------------
def test_model_list_and_retrieve(oai, server):
    models = list(oai.models.list())
    assert len(models) == 1
    card = models[0]
    assert card.id == card.root == MODEL and card.object == "model"
    assert card.owned_by == "radixrt" and isinstance(card.max_model_len, int)
    got = oai.models.retrieve(MODEL)
    assert got.id == got.root == MODEL and got.max_model_len == card.max_model_len
    # Aliases: "default", and the hub id "org/name" (a path with a slash) of the served name.
    for alias in ("default", f"HuggingFaceTB/{MODEL}"):
        assert oai.models.retrieve(alias).id == MODEL
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("non-existent-model")
    resp = httpx.get(f"{server.url}/v1/models/meta-llama/Llama-3.1-8B-Instruct", timeout=30)
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["type"] == "invalid_request_error" and MODEL in error["message"]


REQUESTS = [
    ("completions", {"prompt": PROMPT, "max_tokens": 1}),
    ("chat/completions", {"messages": ASK, "max_tokens": 1}),
]


@pytest.mark.parametrize("path,body", REQUESTS)
@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model_in_a_request_is_a_404(server, path, body, stream):
    resp = post(server, path, {"model": "gpt-4", "stream": stream, **body})
    assert resp.status_code == 404, resp.text
    error = resp.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'gpt-4'" in error["message"] and error["type"] == "invalid_request_error"


def test_the_served_model_s_names_are_served(server, oai):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(
            model="meta-llama/Llama-3.1-8B-Instruct", messages=ASK, max_tokens=1
        )
    for (path, body), model in product(REQUESTS, ("default", f"HuggingFaceTB/{MODEL}", None)):
        named = {} if model is None else {"model": model}
        assert post(server, path, {**named, **body}).status_code == 200, (path, model)


# -- completions: SGLang's 32 combinations, streamed and not -------------------------------
COMBOS = list(product([False, True], [None, 5], [False, True], [1, 2], [False, True]))


def _completion_body(echo, logprobs, use_list, n, token_input) -> dict:
    prompt = PROMPT_IDS if token_input else PROMPT
    return {
        "model": MODEL,
        "prompt": [prompt, prompt] if use_list else prompt,
        "temperature": 0,
        "max_tokens": 3,
        "echo": echo,
        "logprobs": logprobs,
        "n": n,
        "stream_options": {"include_usage": True},
    }


def _run_combo(server, combo) -> dict | list[dict]:
    """The unstreamed response of a text-prompt combination, or the events of a streamed
    one (any prompt)."""
    body = _completion_body(*combo[:-1])
    if combo[-1] == "stream":
        return events(server, "completions", body)
    full = post(server, "completions", {k: v for k, v in body.items() if k != "stream_options"})
    assert full.status_code == 200, full.text
    return full.json()


@pytest.fixture(scope="module")
def combo_results(server):
    """{combo: (unstreamed, streamed)}. PROMPT_IDS is PROMPT tokenized, so the unstreamed
    response to the text prompt stands for the one to the ids too (same usage, same echo)."""
    runs = [(*c, "stream") for c in COMBOS] + [(*c, "full") for c in COMBOS if not c[-1]]
    with ThreadPoolExecutor(8) as pool:
        got = dict(zip(runs, pool.map(lambda r: _run_combo(server, r), runs), strict=True))
    return {c: (got[(*c[:-1], False, "full")], got[(*c, "stream")]) for c in COMBOS}


@pytest.mark.parametrize(
    "combo",
    COMBOS,
    ids=[f"echo{int(e)}-lp{lp}-list{int(li)}-n{n}-ids{int(t)}" for e, lp, li, n, t in COMBOS],
)
def test_completion_combination(combo_results, combo):
    echo, logprobs, use_list, n, _ = combo
    full, stream = combo_results[combo]
    count = n * (2 if use_list else 1)
    _check_unstreamed(
        full, echo, logprobs, count, 2 * len(PROMPT_IDS) if use_list else len(PROMPT_IDS)
    )
    *chunks, last = stream
    assert last["choices"] == [] and counts(last["usage"]) == counts(full["usage"])
    assert all(c["usage"] is None and len(c["choices"]) == 1 for c in chunks)
    for i in range(count):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        _check_streamed_choice(mine, full["choices"][i], echo, logprobs)


def _check_unstreamed(full: dict, echo, logprobs, count: int, prompt_tokens: int) -> None:
    """What SGLang's run_completion checks."""
    assert full["id"] and full["created"] and len(full["choices"]) == count
    assert full["usage"]["prompt_tokens"] == prompt_tokens
    assert full["usage"]["completion_tokens"] > 0
    first = full["choices"][0]
    assert first["text"].startswith(PROMPT) if echo else first["text"]
    if logprobs:
        lp = first["logprobs"]
        assert isinstance(lp["tokens"][0], str) and lp["top_logprobs"][1]
        assert 0 < len(lp["top_logprobs"][1]) <= logprobs
        assert (lp["token_logprobs"][0] is None) if echo else lp["token_logprobs"][0]


def _check_streamed_choice(chunks: list[dict], want: dict, echo, logprobs) -> None:
    """One choice's chunks: SGLang's checks (logprobs on every chunk, the prompt first with
    echo), finish_reason on the last chunk only, and the same text, tokens and logprobs as
    the unstreamed choice."""
    assert chunks, "no chunk for this choice"
    assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [
        want["finish_reason"]
    ]
    assert chunks[-1]["matched_stop"] == want["matched_stop"]
    assert "".join(c["text"] for c in chunks) == want["text"]
    if echo:
        assert chunks[0]["text"].startswith(PROMPT)
    if not logprobs:
        assert all(c["logprobs"] is None for c in chunks)
        return
    for k, c in enumerate(chunks):
        assert c["logprobs"] and isinstance(c["logprobs"]["tokens"][0], str), c
        if not (k == 0 and echo):
            assert 0 < len(c["logprobs"]["top_logprobs"][0]) <= logprobs
    joined = {key: [x for c in chunks for x in c["logprobs"][key]] for key in want["logprobs"]}
    assert joined["tokens"] == want["logprobs"]["tokens"]
    assert joined["text_offset"] == want["logprobs"]["text_offset"]
    assert joined["token_logprobs"] == pytest.approx(want["logprobs"]["token_logprobs"], abs=1e-4)
    # The top entries (batched differently, so equal up to float noise: compare the best).
    for got, ref in zip(joined["top_logprobs"], want["logprobs"]["top_logprobs"], strict=True):
        assert (got is None) == (ref is None) and (
            got is None or _best(got) == pytest.approx(_best(ref), abs=1e-4)
        ), (got, ref)


def _best(top: dict[str, float]) -> tuple[str, float]:
    return max(top.items(), key=lambda kv: kv[1])


# -- chat ------------------------------------------------------------------------------------
@pytest.mark.parametrize("logprobs,n", [(None, 1), (3, 2)])
def test_chat_stream_shape(server, logprobs, n):
    body = {
        "model": MODEL,
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 5,
        "n": n,
        "logprobs": bool(logprobs),
        "top_logprobs": logprobs,
        "stream_options": {"include_usage": True},
    }
    full = post(server, "chat/completions", {**body, "stream_options": None}).json()
    *chunks, last = events(server, "chat/completions", body)
    assert last["choices"] == [] and counts(last["usage"]) == counts(full["usage"])
    for i in range(n):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        # SGLang's DeltaMessage field, null in every delta.
        assert all(
            "reasoning_content" in c["delta"] and c["delta"]["reasoning_content"] is None
            for c in mine
        )
        finals = [c for c in mine if c["finish_reason"] is not None]
        assert finals == [mine[-1]], "one finish_reason chunk per choice, the last one"
        assert mine[-1]["finish_reason"] == full["choices"][i]["finish_reason"]
        body_chunks = mine[1:-1]
        assert (
            "".join(c["delta"]["content"] for c in body_chunks)
            == full["choices"][i]["message"]["content"]
        )
        if logprobs:  # SGLang: every chunk between the role and the finish has them
            assert all(
                len(e["top_logprobs"]) == logprobs
                for c in body_chunks
                for e in c["logprobs"]["content"]
            )
            tokens = [e["token"] for c in body_chunks for e in c["logprobs"]["content"]]
            assert tokens == [e["token"] for e in full["choices"][i]["logprobs"]["content"]]


def test_chat_message_fields(server):
    body = {
        "model": MODEL,
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 4,
        "logprobs": True,
        "top_logprobs": 5,
        "n": 2,
    }
    resp = post(server, "chat/completions", body).json()
    assert len(resp["choices"]) == 2 and resp["id"] and resp["created"]
    for choice in resp["choices"]:
        message = choice["message"]
        assert message["role"] == "assistant" and isinstance(message["content"], str)
        assert "reasoning_content" in message and message["reasoning_content"] is None
        assert "tool_calls" not in message
        assert all(len(e["top_logprobs"]) == 5 for e in choice["logprobs"]["content"])
    assert resp["usage"]["completion_tokens"] > 0 and resp["usage"]["prompt_tokens"] > 0


def test_logit_bias_forces_a_token(server):
    token = 3575  # " capital"
    echoed = post(server, "completions", {"prompt": [token], "echo": True, "max_tokens": 1}).json()[
        "choices"
    ][0]["text"]
    piece = echoed[: len(" capital")]
    assert piece == " capital"
    resp = post(
        server,
        "completions",
        {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logit_bias": {str(token): 100}},
    ).json()
    assert resp["choices"][0]["text"] == piece * 3


# -- continue_final_message ------------------------------------------------------------------
PREFIX = "The capital of France is"
QUESTION = [SYSTEM, {"role": "user", "content": "Tell me about France."}]
# SmolLM2's ChatML, rendered by hand: the assistant's message left open.
OPEN_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n"
    "<|im_start|>user\nTell me about France.<|im_end|>\n"
    f"<|im_start|>assistant\n{PREFIX}"
)


def test_continue_final_message_continues_the_prefix(server, oai):
    messages = [*QUESTION, {"role": "assistant", "content": PREFIX}]
    greedy = {"temperature": 0, "max_tokens": 5}
    cont = oai.chat.completions.create(
        model=MODEL, messages=messages, **greedy, extra_body={"continue_final_message": True}
    )
    raw = oai.completions.create(model=MODEL, prompt=OPEN_PROMPT, **greedy)
    assert cont.choices[0].message.content == raw.choices[0].text
    assert cont.usage.prompt_tokens == raw.usage.prompt_tokens
    streamed = oai.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        **greedy,
        extra_body={"continue_final_message": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == raw.choices[0].text
    # Without it the assistant message is history: closed, then a new assistant turn.
    closed = oai.chat.completions.create(model=MODEL, messages=messages, **greedy)
    again = oai.completions.create(
        model=MODEL, prompt=OPEN_PROMPT + "<|im_end|>\n<|im_start|>assistant\n", **greedy
    )
    assert closed.choices[0].message.content == again.choices[0].text
    assert closed.usage.prompt_tokens == again.usage.prompt_tokens
    # add_generation_prompt false (vLLM's field): no new assistant header.
    bare = oai.chat.completions.create(
        model=MODEL, messages=QUESTION, **greedy, extra_body={"add_generation_prompt": False}
    )
    history = OPEN_PROMPT[: OPEN_PROMPT.index("<|im_start|>assistant")]
    plain = oai.completions.create(model=MODEL, prompt=history, **greedy)
    assert bare.choices[0].message.content == plain.choices[0].text
    assert bare.usage.prompt_tokens == plain.usage.prompt_tokens


@pytest.mark.parametrize(
    "messages,extra,words",
    [
        (QUESTION, {"continue_final_message": True}, "messages[-1].role is 'user'"),
        (
            [*QUESTION, {"role": "assistant", "content": PREFIX}],
            {"continue_final_message": True, "add_generation_prompt": True},
            "cannot both",
        ),
    ],
)
def test_continue_final_message_errors(server, messages, extra, words):
    resp = post(server, "chat/completions", {"model": MODEL, "messages": messages, **extra})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "continue_final_message" and words in error["message"], error


# -- SGLang's extra request fields -------------------------------------------------------------
def test_stop_regex_ends_the_output(server):
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "temperature": 0,
        "max_tokens": 12,
        "ignore_eos": True,
    }
    text = post(server, "completions", body).json()["choices"][0]["text"]
    word = next(w for w in text.split()[1:] if w.isalpha())
    cut = post(server, "completions", {**body, "stop_regex": rf"\b{word}\b"}).json()
    choice = cut["choices"][0]
    start = re.search(rf"\b{word}\b", text).start()
    assert choice["finish_reason"] == "stop" and choice["text"] == text[:start]


@pytest.mark.parametrize(
    "field,value", [("custom_logit_processor", "{}"), ("lora_path", "adapter")]
)
def test_unsupported_sglang_fields_are_refused_by_name(server, field, value):
    resp = post(
        server, "chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 1, field: value}
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == field and "not supported" in error["message"], error
    # At their null value they ask for nothing.
    ok = post(
        server, "chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 1, field: None}
    )
    assert ok.status_code == 200, ok.text
