"""How much resident memory the server's main process keeps after refusing a prompt ten times
its context: starts `radixrt launch`, sends /generate and /v1/completions a text of about
`--factor` x the context in tokens (answered 400: over the context), and prints VmRSS of the
main process before and after each refusal (from /proc/<pid>/status).

    .venv/bin/python scripts/measure_refusal_rss.py               # the default model
    .venv/bin/python scripts/measure_refusal_rss.py --server-args "--log-level info"

The text is an English sentence repeated (about 4.4 characters per token with SmolLM2's
tokenizer); each refusal is checked to be a 400 that says "maximum context length"."""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time

import httpx
from measure_sigterm import launch  # the same start-up: a free port, wait for /health

SENTENCE = "The quick brown fox jumps over the lazy dog, again and again. "
CHARS_PER_TOKEN = 4.4


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def refuse(url: str, path: str, text: str) -> None:
    if path == "/generate":
        body: dict = {"text": text, "sampling_params": {"max_new_tokens": 8}}
    else:
        body = {"prompt": text, "max_tokens": 8}
    r = httpx.post(url + path, json=body, timeout=300)
    assert r.status_code == 400 and "maximum context length" in r.text, (r.status_code, r.text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--factor", type=float, default=10.0, help="the prompt, in contexts")
    p.add_argument("--repeat", type=int, default=3, help="refusals per endpoint")
    p.add_argument("--server-args", default="", help="extra `radixrt launch` flags, one string")
    args = p.parse_args()
    log = tempfile.mktemp(prefix="radixrt-refusal-", suffix=".log")
    proc, url = launch(shlex.split(args.server_args), log)
    try:
        context = httpx.get(url + "/get_server_info", timeout=30).json()["context_length"]
        chars = int(context * args.factor * CHARS_PER_TOKEN)
        text = (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]
        for _ in range(3):  # the ordinary allocations of a request, made once
            r = httpx.post(
                url + "/generate",
                json={"text": "Hi", "sampling_params": {"max_new_tokens": 4}},
                timeout=120,
            )
            r.raise_for_status()
        time.sleep(1)
        start = rss_mb(proc.pid)
        for path in ("/generate", "/v1/completions"):
            for i in range(args.repeat):
                before = rss_mb(proc.pid)
                refuse(url, path, text)
                time.sleep(0.5)
                after = rss_mb(proc.pid)
                kept = {"path": path, "refusal": i + 1, "chars": chars}
                kept |= {"rss_before_mb": round(before, 1), "rss_after_mb": round(after, 1)}
                print(json.dumps(kept | {"kept_mb": round(after - before, 1)}), flush=True)
        print(f"kept after {2 * args.repeat} refusals: {rss_mb(proc.pid) - start:.1f} MB")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
