"""`radixrt launch` on a tiny random model: the API key and the queue limit (503). A child
process that dies, SIGTERM and orphans: tests/reliability/test_processes.py."""

from __future__ import annotations

import time

import httpx
import pytest
from launch_helpers import tiny_server_flags

from radixrt.lang.backends.zmq_client import FrontendError, ZmqClient

KEY = "sk-test-123"
LONG = {"max_new_tokens": 3000, "ignore_eos": True}


@pytest.fixture(scope="module")
def guarded(launch_server, tiny_model_dir):
    # A long context, so that LONG requests run for seconds.
    path = tiny_model_dir("llama", max_position_embeddings=32768)
    return launch_server(
        *tiny_server_flags(path, 8192),
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "1",
        api_key=KEY,
    )


def test_api_key_is_required_everywhere_but_health(guarded):
    url = guarded.url
    assert httpx.get(url + "/health").status_code == 200
    for method, path in [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/generate"),
        ("GET", "/get_server_info"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/server_info"),
        ("GET", "/model_info"),
        ("GET", "/health_generate"),
        ("GET", "/version"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
    ]:
        r = httpx.request(method, url + path, json={})
        assert r.status_code == 401, path
        assert "API key" in r.json()["error"]["message"]
        wrong = httpx.request(method, url + path, json={}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401, path
    ok = httpx.post(
        url + "/generate",
        json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}},
        headers=guarded.headers,
        timeout=30,
    )
    assert ok.status_code == 200


def test_zmq_frontend_checks_the_api_key_too(guarded):
    info = httpx.get(guarded.url + "/get_server_info", headers=guarded.headers).json()
    with ZmqClient(info["zmq_frontend_address"]) as anonymous:
        with pytest.raises(FrontendError) as e:
            anonymous.generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 2})
        assert e.value.status == 401
    with ZmqClient(info["zmq_frontend_address"], api_key=KEY) as client:
        assert (
            client.generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 2})["meta_info"][
                "completion_tokens"
            ]
            == 2
        )


def test_past_max_queued_requests_new_requests_get_503(guarded):
    url, headers = guarded.url, guarded.headers
    body = {"input_ids": [5, 6, 7], "stream": True, "sampling_params": LONG}
    # One running + one queued fill max_running_requests (1) + max_queued_requests (1).
    with (
        httpx.stream("POST", url + "/generate", json=body, headers=headers, timeout=60) as a,
        httpx.stream("POST", url + "/generate", json=body, headers=headers, timeout=60) as b,
    ):
        lines_a = a.iter_lines()  # keep it: a dropped line iterator closes the stream
        next(lines_a)
        assert b.status_code == 200
        info = httpx.get(url + "/get_server_info", headers=headers).json()
        assert (info["running"], info["queued"]) == (1, 1)
        third = httpx.post(
            url + "/v1/completions",
            headers=headers,
            timeout=30,
            json={"prompt": [5, 6], "max_tokens": 2},
        )
        assert third.status_code == 503
        assert "max_queued_requests" in third.json()["error"]["message"]
    deadline = time.monotonic() + 30
    while True:  # the two streams were dropped: they abort and the server takes work again
        r = httpx.post(
            url + "/generate",
            json={"input_ids": [5], "sampling_params": {"max_new_tokens": 1}},
            headers=headers,
            timeout=30,
        )
        if r.status_code == 200:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)
