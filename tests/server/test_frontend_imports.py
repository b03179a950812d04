"""The HTTP process never loads torch, nor the scheduler, the model runner, the models or
the cache.

A real `radixrt launch` of the default model (a GGUF file: its tokenizer and /model_info read
GGUF) runs under `python -X importtime`, which logs every module the process imports, lazily
or not, to its stderr (the flag is not passed on to its children, whose own imports therefore
do not show). The server serves one request of every kind, constrained ones and tool calls
included; then its main process's memory map must hold no libtorch (the external signal: a
module could hide from the log, a loaded shared object cannot), the server is stopped, and the
log says what its main process imported.
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
from launch_helpers import STARTUP_TIMEOUT_S, free_port

FORBIDDEN = (
    "torch",
    "xgrammar",
    "radixrt.scheduler",
    "radixrt.executor",
    "radixrt.models",
    "radixrt.cache",
)
# The model registry is a table of names (each model is imported when it is built): the engine
# reads it to refuse an unsupported architecture before anything loads.
ALLOWED = ("radixrt.models", "radixrt.models.registry")
# Loaded only on the paths exercised below: their presence shows the log catches lazy imports.
EXPECTED = (
    "transformers",
    "radixrt.entrypoints.openai.api",
    "radixrt.frontend.validation",
    "radixrt.grammar.checker",
    "radixrt.grammar.xgrammar_process",
    "radixrt.entrypoints.openai.tool_calls",
    "radixrt.loader.gguf_metadata",
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
STRUCTURAL_TAG = {
    "type": "structural_tag",
    "structures": [{"begin": "<n>", "schema": {"type": "integer"}, "end": "</n>"}],
    "triggers": ["<n>"],
}
GREEDY = {"temperature": 0, "max_new_tokens": 4}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[str, str]:
    """(the main process's memory map once it served `_serve_every_kind`, its stderr after
    it was stopped)."""
    from radixrt.loader.default_model import default_model_path

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
        "--model-path",
        default_model_path(),
        "--max-total-tokens",
        "4096",
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
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return maps, log.read_text()


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
    ok("POST", "/generate", {"text": "?", "sampling_params": {**GREEDY, "ebnf": 'root ::= "yes"'}})
    tag = json.dumps(STRUCTURAL_TAG)
    ok("POST", "/generate", {"text": "n", "sampling_params": {**GREEDY, "structural_tag": tag}})
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
    named = {"type": "function", "function": {"name": "pick"}}
    ok(
        "POST",
        "/v1/chat/completions",
        {**chat, "max_tokens": 16, "tools": [TOOL], "tool_choice": named},
    )
    ok("POST", "/v1/chat/completions", {**chat, "tools": [TOOL]})  # auto: a structural tag
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
    bad_tool = {**TOOL, "function": {"name": "f", "parameters": {"type": "no-such-type"}}}
    bad = client.post("/v1/chat/completions", json={**chat, "tools": [bad_tool]})
    assert bad.status_code == 400 and "parameters" in bad.json()["error"]["param"], bad.text
    _abort_a_stream(client)
    info = ok("GET", "/model_info").json()
    assert (info["load_format"], info["architectures"]) == ("gguf", ["LlamaForCausalLM"]), info
    for path in (
        "/get_server_info",
        "/server_info",
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


def test_the_http_process_never_maps_libtorch(served):
    maps, _ = served
    assert "libc" in maps, "not a memory map"
    torch_files = {line.split()[-1] for line in maps.splitlines() if "libtorch" in line}
    assert not torch_files, f"the HTTP process loaded {sorted(torch_files)}"


def test_the_http_process_never_imports_torch_or_the_scheduler_side(served):
    imported = _imported(served[1])
    missing = [name for name in EXPECTED if name not in imported]
    assert not missing, f"the import log misses {missing}: it does not show what ran"
    loaded = sorted(
        name
        for name in imported
        if any(name == p or name.startswith(p + ".") for p in FORBIDDEN) and name not in ALLOWED
    )
    assert not loaded, f"the HTTP process imported {loaded}"
