"""`radixrt launch` as a real subprocess on loopback with the default model (float32, so that
greedy text is the same whatever the batch): the openai client, the native API, concurrency,
disconnects, metrics, the ZeroMQ frontend and SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from itertools import pairwise

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixrt.lang.backends.zmq_client import ZmqClient

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"


def stats(server) -> dict:
    return httpx.get(server.url + "/get_server_info", timeout=30).json()


def metrics(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def wait_idle(server, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = stats(server)
        if info["running"] == 0 and info["queued"] == 0:
            return info
        assert time.monotonic() < deadline, f"requests still running: {info}"
        time.sleep(0.2)


def test_openai_client_completion_chat_stream_n_stop_logprobs(oai):
    comp = oai.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert comp.choices[0].text and comp.usage.completion_tokens == 8
    chat = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        max_tokens=16,
        temperature=0,
    )
    assert chat.choices[0].message.content
    pieces, usage = [], None
    for chunk in oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        pieces += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(pieces) == chat.choices[0].message.content
    assert usage.completion_tokens == chat.usage.completion_tokens
    two = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a word."}],
        max_tokens=6,
        n=2,
        seed=3,
    )
    assert sorted(c.index for c in two.choices) == [0, 1]
    stopped = oai.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 6"]
    )
    assert " 6" not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"
    lp = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)


def test_native_generate_text_batch_stream_and_logprobs(server):
    url = server.url + "/generate"
    greedy = {"temperature": 0, "max_new_tokens": 10}
    one = httpx.post(
        url, json={"text": "Once upon a time", "sampling_params": greedy}, timeout=60
    ).json()
    assert one["meta_info"]["completion_tokens"] == 10 and one["text"]
    batch = httpx.post(
        url,
        json={"input_ids": [one["output_ids"][:3], [1, 2, 3]], "sampling_params": greedy},
        timeout=60,
    ).json()
    assert isinstance(batch, list) and len(batch) == 2
    events = []
    with httpx.stream(
        "POST",
        url,
        json={"text": "Once upon a time", "stream": True, "sampling_params": greedy},
        timeout=60,
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["text"] == one["text"]  # SGLang's native streams carry the text so far
    assert all(b["text"].startswith(a["text"]) for a, b in pairwise(chunks))
    lp = httpx.post(
        url,
        json={
            "text": "Hello there",
            "sampling_params": greedy,
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
        },
        timeout=60,
    ).json()
    meta = lp["meta_info"]
    assert len(meta["output_token_logprobs"]) == 10
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert all(len(t) == 2 for t in meta["output_top_logprobs"])


CONTEXT = 8192
BAD_INPUTS = [
    ("/v1/chat/completions", b"{not json", "JSON"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, "messages"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"},
        "max_tokens",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**6}, "max_tokens"),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": [5] * (CONTEXT + 10), "max_tokens": 1},
        "context",
    ),
    ("/generate", b"[1, 2", "JSON"),
    ("/generate", {"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
    ("/generate", {"text": 5}, "prompt"),
    ("/generate", {"text": "x", "stream": "yes"}, "stream"),
    ("/generate", {"input_ids": [10**9]}, "input_ids"),
    ("/generate", {"text": "x", "sampling_params": {"regex": "(["}}, "regex"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": "{oops"}}, "json_schema"),
    (
        "/generate",
        {"text": "x", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}},
        "at most one",
    ),
]


@pytest.mark.parametrize("path,body,needle", BAD_INPUTS)
def test_bad_input_gets_400_naming_the_field_and_the_server_keeps_serving(
    server, path, body, needle
):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + path, timeout=60, **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle.lower() in (err["message"] + str(err.get("param"))).lower(), err
    ok = httpx.post(
        server.url + "/generate",
        json={"text": "ok", "sampling_params": {"max_new_tokens": 1}},
        timeout=60,
    )
    assert ok.status_code == 200


def test_constrained_generation_through_the_native_api(server):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
    }
    outs = httpx.post(
        server.url + "/generate",
        timeout=120,
        json={
            "text": ["A person as JSON:", "Bob, 41, as JSON:"],
            "sampling_params": {
                "json_schema": schema,
                "temperature": 1.0,
                "max_new_tokens": 48,
                "seed": 1,
            },
        },
    ).json()
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), schema)
    phone = httpx.post(
        server.url + "/generate",
        timeout=60,
        json={
            "text": "Call me at",
            "sampling_params": {"regex": r" \(\d{3}\) \d{3}-\d{4}", "max_new_tokens": 20},
        },
    ).json()
    assert re.fullmatch(r" \(\d{3}\) \d{3}-\d{4}", phone["text"]), phone["text"]


def test_32_concurrent_streams_equal_one_at_a_time(server, oai):
    prompts = [f"Write a fact about the number {i}." for i in range(32)]

    def one(p):
        r = oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=12, temperature=0
        )
        return r.choices[0].message.content

    sequential = [one(p) for p in prompts]

    async def stream(client, p):
        aclient = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="x", http_client=client, max_retries=0
        )
        out = []
        async for chunk in await aclient.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": p}],
            max_tokens=12,
            temperature=0,
            stream=True,
        ):
            out += [c.delta.content or "" for c in chunk.choices]
        return "".join(out)

    async def all_at_once():
        async with httpx.AsyncClient(
            timeout=120, limits=httpx.Limits(max_connections=64)
        ) as client:
            return await asyncio.gather(*(stream(client, p) for p in prompts))

    assert asyncio.run(all_at_once()) == sequential


def test_client_disconnect_mid_stream_aborts_and_frees_kv(server):
    aborted_before = metrics(server).get("radixrt:num_aborted_requests_total", 0)
    body = {
        "text": "Count forever:",
        "stream": True,
        "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
    }
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
        assert stats(server)["running"] == 1
    info = wait_idle(server)
    # Nothing held by a request: every token is free or evictable cache.
    assert info["free_tokens"] + info["evictable_tokens"] == info["pool_tokens"]
    assert metrics(server)["radixrt:num_aborted_requests_total"] == aborted_before + 1


def test_client_gone_while_waiting_for_a_whole_answer_aborts_it(server):
    body = {
        "text": "Count forever:",
        "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
    }
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(server.url + "/generate", json=body, timeout=2)
    info = wait_idle(server)
    assert info["free_tokens"] + info["evictable_tokens"] == info["pool_tokens"]


def test_flush_cache_refused_while_running_and_abort_request(server):
    url = server.url
    body = {
        "text": "Count:",
        "rid": "long-one",
        "stream": True,
        "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
    }
    with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)
        refused = httpx.post(url + "/flush_cache", timeout=30)
        assert refused.status_code == 400 and not refused.json()["success"]
        assert httpx.post(url + "/abort_request", json={"rid": "long-one"}, timeout=30).json()[
            "success"
        ]
        last = [json.loads(x[6:]) for x in lines if x.startswith("data: {")][-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    wait_idle(server)
    assert httpx.post(url + "/flush_cache", timeout=30).json()["success"]


def test_info_endpoints(server, oai):
    assert [m.id for m in oai.models.list().data] == [MODEL]
    model = httpx.get(server.url + "/get_model_info", timeout=30).json()
    assert model["is_generation"] and model["context_length"] == CONTEXT
    assert "<|im_start|>" in model["chat_template"] and model["eos_token"] == "<|im_end|>"
    info = stats(server)
    assert info["max_total_num_tokens"] == 16384 and info["host"] == "127.0.0.1"
    assert "api_key" not in info and info["zmq_frontend_address"].startswith("tcp://127.0.0.1:")


def test_metrics_parse_and_move(server):
    before = metrics(server)
    httpx.post(
        server.url + "/generate",
        json={"text": "Hello", "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}},
        timeout=60,
    )
    after = metrics(server)
    for name, delta in [
        ("radixrt:num_requests_total", 1),
        ("radixrt:generation_tokens_total", 5),
        ("radixrt:time_to_first_token_seconds_count", 1),
        ("radixrt:e2e_request_latency_seconds_count", 1),
    ]:
        assert after[name] == before.get(name, 0) + delta, name
    assert after["radixrt:prompt_tokens_total"] > before["radixrt:prompt_tokens_total"]
    for gauge in (
        "radixrt:num_running_reqs",
        "radixrt:num_queue_reqs",
        "radixrt:token_usage",
        "radixrt:cache_hit_rate",
        "radixrt:num_preemptions_total",
    ):
        assert gauge in after


def test_zmq_frontend_serves_the_same_engine(server):
    address = stats(server)["zmq_frontend_address"]
    greedy = {"temperature": 0, "max_new_tokens": 8}
    http_out = httpx.post(
        server.url + "/generate", json={"text": "The sky is", "sampling_params": greedy}, timeout=60
    ).json()
    with ZmqClient(address) as client:
        out = client.generate("The sky is", greedy)
        assert out["output_ids"] == http_out["output_ids"] and out["text"] == http_out["text"]
        assert out["meta_info"]["cached_tokens"] > 0  # the HTTP request cached the prompt
        streamed = "".join(c["text"] for c in client.generate_stream("The sky is", greedy))
        assert streamed == http_out["text"]
        assert client.get_server_info()["max_total_num_tokens"] == 16384
        with pytest.raises(Exception, match="temperature"):
            client.generate("x", {"temperature": -1})


def test_sigterm_stops_all_three_processes(launch_server, tiny_model_dir):
    # A server of its own: the default one is shared by the whole run.
    server = launch_server("--model-path", tiny_model_dir("llama"), "--log-level", "warning")
    children = server.children()
    assert len(children) == 2  # the scheduler and the detokenizer
    server.proc.send_signal(15)
    assert server.proc.wait(timeout=60) == 0
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in children):
        assert time.monotonic() < deadline, "a child outlived the server"
        time.sleep(0.1)
