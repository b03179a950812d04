"""A prompt ten times the context, refused with a 400, leaves no large heap behind in the
server's main process: tokenizing it took ~45 MB of transient memory in a worker thread's malloc
arena, which glibc kept (46 MB more resident after one refusal before the fix, ~0-9 MB after:
scripts/measure_refusal_rss.py); the HTTP layer now gives free pages back after a large body."""

from __future__ import annotations

import time

import httpx
import pytest

SENTENCE = "The quick brown fox jumps over the lazy dog, again and again. "
CHARS_PER_TOKEN = 4.4  # SmolLM2's tokenizer on SENTENCE
KEPT_LIMIT_MB = 24  # the old code kept 46 MB after the first refusal alone


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.fixture(scope="module")
def fresh_server(launch_server):
    """The default model in a server of its own: what the shared one served before (its
    threads' arenas, its caches) moved its resident size by tens of MB in the full suite, so
    a shared server's before-and-after says little about one refusal."""
    return launch_server("--dtype", "float32", "--log-level", "warning")


def test_a_prompt_ten_times_the_context_is_refused_without_keeping_its_memory(fresh_server):
    server = fresh_server
    context = httpx.get(server.url + "/get_server_info", timeout=30).json()["context_length"]
    chars = int(10 * context * CHARS_PER_TOKEN)
    text = (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]
    bodies = {
        "/generate": {"text": text, "sampling_params": {"max_new_tokens": 8}},
        "/v1/completions": {"prompt": text, "max_tokens": 8},
    }
    before = _rss_mb(server.proc.pid)
    for path, body in bodies.items():
        r = httpx.post(server.url + path, json=body, timeout=300)
        assert r.status_code == 400 and "maximum context length" in r.text, r.text
    deadline = time.monotonic() + 10  # the memory is given back just after the answer is sent
    while (kept := _rss_mb(server.proc.pid) - before) >= KEPT_LIMIT_MB:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert kept < KEPT_LIMIT_MB, f"{kept:.1f} MB more resident after two refusals"
