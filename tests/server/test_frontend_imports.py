"""The HTTP process never loads the scheduler, the model runner, the models or the cache.

A real `radixrt launch` runs under `python -X importtime`, which logs every module the process
imports, lazily or not, to its stderr (the flag is not passed on to the scheduler and
detokenizer children, whose own imports therefore do not show). The server then serves one
request of every kind, is stopped, and the log says what its main process loaded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from launch_helpers import STARTUP_TIMEOUT_S, free_port, tiny_server_flags

FORBIDDEN = ("radixrt.scheduler", "radixrt.executor", "radixrt.models", "radixrt.cache")
# Loaded only on the paths exercised below: their presence shows the log catches lazy imports.
EXPECTED = (
    "radixrt.entrypoints.openai.api",
    "radixrt.frontend.validation",
    "radixrt.grammar.checker",
    "radixrt.entrypoints.openai.tool_calls",
    "radixrt.entrypoints.zmq_frontend",
)
TOOL = {
    "type": "function",
    "function": {
        "name": "pick",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    },
}
GREEDY = {"temperature": 0, "max_new_tokens": 4}


@pytest.fixture(scope="module")
def imports_log(tiny_model_dir, tmp_path_factory) -> str:
    """The stderr of a launched server, stopped after serving `_serve_every_kind`."""
    log = tmp_path_factory.mktemp("imports") / "server.log"
    port = free_port()
    cmd = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "radixrt.cli",
        "launch",
        "--port",
        str(port),
        *tiny_server_flags(tiny_model_dir("llama")),
        "--log-level",
        "warning",
    ]
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, url, log)
        _serve_every_kind(url, _zmq_address(log.read_text()))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return log.read_text()


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the server did not become healthy:\n{log.read_text()[-3000:]}")


def _zmq_address(log: str) -> str:
    found = re.search(r"ZeroMQ frontend: (\S+);", log)
    assert found, log[-3000:]
    return found.group(1)


def _serve_every_kind(url: str, zmq_address: str) -> None:
    client = httpx.Client(base_url=url, timeout=120)

    def ok(method: str, path: str, body: dict | None = None) -> httpx.Response:
        r = client.request(method, path, json=body)
        assert r.status_code == 200, (path, r.text)
        return r

    ok("POST", "/generate", {"text": "Hi", "sampling_params": GREEDY})
    ok(
        "POST",
        "/generate",
        {
            "input_ids": [[5, 6], [7]],
            "sampling_params": GREEDY,
            "return_logprob": True,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
            "logprob_start_len": 0,
        },
    )
    ok("POST", "/generate", {"text": "Hi", "stream": True, "sampling_params": GREEDY})
    ok("POST", "/generate", {"text": "n=", "sampling_params": {**GREEDY, "regex": "[0-9]+"}})
    ok(
        "POST",
        "/generate",
        {
            "text": "{",
            "sampling_params": {
                **GREEDY,
                "max_new_tokens": 12,
                "json_schema": json.dumps({"type": "object"}),
            },
        },
    )
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    ok("POST", "/v1/chat/completions", chat)
    ok(
        "POST",
        "/v1/chat/completions",
        {**chat, "stream": True, "logprobs": True, "top_logprobs": 1},
    )
    ok(
        "POST",
        "/v1/chat/completions",
        {**chat, "max_tokens": 16, "tools": [TOOL], "tool_choice": "required"},
    )
    ok(
        "POST",
        "/v1/chat/completions",
        {
            **chat,
            "max_tokens": 12,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "o", "schema": {"type": "object"}},
            },
        },
    )
    ok("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3, "logprobs": 1, "echo": True})
    ok("POST", "/v1/completions", {"prompt": [[5, 6], [7]], "max_tokens": 3, "stream": True})
    bad = client.post("/v1/completions", json={"prompt": [5, 99999], "max_tokens": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt", bad.text
    bad = client.post("/generate", json={"text": "x", "sampling_params": {"regex": "(["}})
    assert bad.status_code == 400, bad.text
    _abort_a_stream(client)
    for path in (
        "/get_server_info",
        "/server_info",
        "/model_info",
        "/v1/models",
        "/metrics",
        "/version",
        "/health_generate",
    ):
        ok("GET", path)
    ok("POST", "/flush_cache")
    ok("POST", "/tokenize", {"prompt": "Hi"})
    ok("POST", "/detokenize", {"tokens": [72, 105]})
    _zmq_requests(zmq_address)


def _abort_a_stream(client: httpx.Client) -> None:
    body = {
        "text": "Go",
        "rid": "long-one",
        "stream": True,
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0},
    }
    with client.stream("POST", "/generate", json=body) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # it is running
        abort = threading.Thread(
            target=client.post, args=("/abort_request",), kwargs={"json": {"rid": "long-one"}}
        )
        abort.start()
        rest = "\n".join(lines)
        abort.join()
    assert '"abort"' in rest, rest[-500:]


def _zmq_requests(address: str) -> None:
    from radixrt.lang.backends.zmq_client import ZmqClient

    zmq = ZmqClient(address, timeout_s=120)
    try:
        assert zmq.generate("Hi", GREEDY)["meta_info"]["completion_tokens"] >= 1
        assert list(zmq.generate_stream("Hi", GREEDY))
        zmq.flush_cache()
        zmq.get_server_info()
    finally:
        zmq.close()


def _imported(log: str) -> set[str]:
    """Module names from the `-X importtime` lines (`import time: self | cumulative | name`)."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in log.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def test_the_http_process_never_imports_the_scheduler_side(imports_log):
    imported = _imported(imports_log)
    missing = [name for name in EXPECTED if name not in imported]
    assert not missing, f"the import log misses {missing}: it does not show what ran"
    loaded = sorted(
        name for name in imported if any(name == p or name.startswith(p + ".") for p in FORBIDDEN)
    )
    assert not loaded, f"the HTTP process imported {loaded}"
