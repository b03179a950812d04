"""A launched tiny-model server's log: the start-up phases in order, each process's lines in the
one format, and with --log-requests one access line per request (none from uvicorn, no key)."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from launch_helpers import tiny_server_flags

API_KEY = "sk-startup-log-test"
LINE = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (frontend|scheduler|detokenizer)\] "
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: "
)
PHASES = [  # in the order they happen
    r"scheduler\] INFO radixrt\.loader: loading weights: \S+ \(float32 on cpu\)$",
    r"scheduler\] INFO radixrt\.loader: loading weights: \d+% \(\d+/\d+ tensors\)$",
    r"scheduler\] INFO radixrt\.loader: loaded weights: [\d.]+ MiB in [\d.]+ s$",
    r"scheduler\] INFO [\w.]+: KV pool: 2048 tokens \([\d.]+ MiB\), page size 1, built in",
    r"scheduler\] INFO radixrt\.scheduler: scheduler ready in [\d.]+ s",
    r"frontend\] INFO radixrt\.server: warm-up: one request through every process in [\d.]+ s$",
    r"frontend\] INFO radixrt\.server: ready: serving at {url} \(start-up [\d.]+ s\)$",
]


@pytest.fixture(scope="module")
def server(launch_server, tiny_model_dir):
    server = launch_server(
        *tiny_server_flags(tiny_model_dir("llama")),
        "--log-requests",
        api_key=API_KEY,
    )
    headers = server.headers
    assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 200
    assert httpx.get(server.url + "/v1/models").status_code == 401
    body = {"text": "a private prompt", "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(server.url + "/generate", json=body, headers=headers).status_code == 200
    _wait_for(server, '"POST /generate" 200')
    return server


def _wait_for(server, text: str, timeout_s: float = 10) -> None:
    """Access lines are written once the answer is out: a moment after the client has it."""
    deadline = time.monotonic() + timeout_s
    while text not in server.log_text():
        assert time.monotonic() < deadline, server.log_text()[-3000:]
        time.sleep(0.1)


def test_start_up_phases_are_logged_in_order(server):
    lines = server.log_text().splitlines()
    at = 0
    for phase in PHASES:
        pattern = re.compile(phase.format(url=re.escape(server.url)))
        found = next((i for i in range(at, len(lines)) if pattern.search(lines[i])), None)
        assert found is not None, f"no line after line {at} matches {phase}:\n" + "\n".join(lines)
        at = found


def test_every_log_line_is_in_the_one_format(server):
    lines = server.log_text().splitlines()
    logged = [line for line in lines if line.startswith("[")]
    assert logged and all(LINE.match(line) for line in logged), "\n".join(logged)
    roles = {LINE.match(line).group(1) for line in logged}  # type: ignore[union-attr]
    assert {"frontend", "scheduler"} <= roles
    assert any("INFO uvicorn.error: Uvicorn running on" in line for line in logged)
    # Everything else is the banner: its first line and its indented details.
    others = [line for line in lines if not line.startswith("[")]
    assert all(line.startswith(("radixrt ", "  ")) for line in others), "\n".join(others)


def test_each_request_has_one_access_line_without_secrets(server):
    text = server.log_text()
    access = re.compile(r'radixrt\.access: 127\.0\.0\.1:\d+ "(\w+) (\S+)" (\d{3}) [\d.]+ ms$')
    seen = [m.groups() for line in text.splitlines() if (m := access.search(line))]
    assert seen.count(("GET", "/v1/models", "200")) == 1, seen
    assert seen.count(("GET", "/v1/models", "401")) == 1, seen
    assert seen.count(("POST", "/generate", "200")) == 1, seen
    assert ("GET", "/health", "200") in seen  # the launch helper's polling
    assert "HTTP/1.1" not in text, "uvicorn's own access log is on too"
    assert API_KEY not in text and "private prompt" not in text
