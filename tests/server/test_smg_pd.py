"""Prefill/decode disaggregation behind SGLang's gateway in its PD mode (`smg launch
--pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL`), with real processes: a
radixrt prefill server and a radixrt decode server (tiny random-weight model, float32, KV
checks on), and one ordinary server as the reference.

- SMG detects both as SGLang workers and sends them the bootstrap fields; greedy output
  through it equals the single server's for /generate (text and batched ids), chat (n = 2,
  streamed too) and completions; SMG's logprob merge gets the prompt's from the prefill;
- each side counts its transfers, and both pools are back to free + cached after the run;
- killing the decode server leaves the prefill server serving, with every page back;
- a decode server whose prefill server is gone recomputes its rooms within the timeout.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from launch_helpers import assert_pool_conserved, free_port, server_stats

SMG = shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
pytestmark = pytest.mark.skipif(
    not Path(SMG).exists(), reason="SMG (SGLang's model gateway, `pip install smg`) is absent"
)
MODEL = "tiny"
FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096", "--served-model-name", MODEL)
FLAGS += ("--log-level", "warning", "--enable-kv-checks", "--page-size", "4")
GREEDY_8 = {"max_new_tokens": 8, "temperature": 0}
TIMEOUT_S = 3.0  # --disaggregation-transfer-timeout of both sides


@pytest.fixture(scope="module")
def servers(launch_server, tiny_model_dir):
    model = tiny_model_dir("llama")
    bootstrap = free_port()
    pd = ("--disaggregation-transfer-timeout", str(TIMEOUT_S))
    prefill = launch_server("--model-path", model, *FLAGS, *pd, "--disaggregation-mode",
                            "prefill", "--disaggregation-bootstrap-port", str(bootstrap),
                            "--chunked-prefill-size", "8")  # fmt: skip
    decode = launch_server("--model-path", model, *FLAGS, *pd, "--disaggregation-mode", "decode")
    single = launch_server("--model-path", model, *FLAGS)
    return {"prefill": prefill, "decode": decode, "single": single, "bootstrap": bootstrap}


@pytest.fixture(scope="module")
def gateway(servers, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("smg-pd") / "smg.log"
    cmd = [SMG, "launch", "--host", "127.0.0.1", "--port", str(port), "--pd-disaggregation",
           "--prefill", servers["prefill"].url, str(servers["bootstrap"]),
           "--decode", servers["decode"].url, "--prometheus-port", str(free_port()),
           "--log-level", "warn"]  # fmt: skip
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_workers(proc, url, log)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_for_workers(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"smg exited: {log.read_text(errors='replace')[-3000:]}"
        try:
            workers = httpx.get(url + "/workers", timeout=5).json()["workers"]
            if len(workers) == 2 and all(w["is_healthy"] for w in workers):
                assert {w["runtime_type"] for w in workers} == {"sglang"}, workers
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.3)
    pytest.fail(f"smg did not register both workers: {log.read_text(errors='replace')[-3000:]}")


def _post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _chat_body(**extra) -> dict:
    messages = [{"role": "user", "content": "tell me about the sea"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0, **extra}


def test_outputs_through_the_gateway_equal_one_server(gateway, servers):
    single = servers["single"].url
    gen = {
        "text": "hello there, radix",
        "sampling_params": {"max_new_tokens": 16, "temperature": 0},
    }
    assert _post(gateway, "/generate", gen)["text"] == _post(single, "/generate", gen)["text"]
    batch = {
        "input_ids": [[5, 6, 7, 8, 9], [40, 41, 42]],
        "sampling_params": gen["sampling_params"],
    }
    got, want = _post(gateway, "/generate", batch), _post(single, "/generate", batch)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    chat = _chat_body(n=2)
    got_chat, want_chat = (
        _post(gateway, "/v1/chat/completions", chat),
        _post(single, "/v1/chat/completions", chat),
    )
    texts = [c["message"]["content"] for c in got_chat["choices"]]
    assert texts == [c["message"]["content"] for c in want_chat["choices"]]
    comp = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 10, "temperature": 0}
    got_c, want_c = _post(gateway, "/v1/completions", comp), _post(single, "/v1/completions", comp)
    assert got_c["choices"][0]["text"] == want_c["choices"][0]["text"]
    streamed = ""
    with httpx.stream(
        "POST", gateway + "/v1/chat/completions", json=_chat_body(stream=True), timeout=120
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    streamed += choice["delta"].get("content") or ""
    assert streamed == want_chat["choices"][0]["message"]["content"]


def test_logprobs_merge_and_transfer_counts(gateway, servers):
    body = {"text": "counting the waves", "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0}}  # fmt: skip
    got, want = _post(gateway, "/generate", body), _post(servers["single"].url, "/generate", body)
    meta, want_meta = got["meta_info"], want["meta_info"]
    assert got["output_ids"] == want["output_ids"]
    # SMG puts the prefill server's prompt logprobs before the decode server's (none).
    assert [t for _, t, *_ in meta["input_token_logprobs"]] == [
        t for _, t, *_ in want_meta["input_token_logprobs"]
    ]
    assert meta["output_token_logprobs"] == want_meta["output_token_logprobs"]
    for side in ("prefill", "decode"):
        stats = server_stats(servers[side])
        assert stats["disaggregation_mode"] == side
        assert stats["disagg_transfers"] >= 6 and stats["disagg_transfer_failures"] == 0, stats
        assert_pool_conserved(servers[side])
    loads = httpx.get(servers["decode"].url + "/v1/loads?include=core,disagg", timeout=10).json()
    assert loads["loads"][0]["disagg_mode"] == "decode"


def test_a_decode_server_whose_prefill_is_gone_recomputes(servers):
    """Rooms pointed at a port nobody listens on: recomputed after the timeout, output exact."""
    body = {"input_ids": [3, 1, 4, 1, 5, 9, 2, 6], "sampling_params": GREEDY_8,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": free_port(),
            "bootstrap_room": 99}  # fmt: skip
    start = time.monotonic()
    got = _post(servers["decode"].url, "/generate", body)
    assert time.monotonic() - start < TIMEOUT_S + 10
    plain = {k: v for k, v in body.items() if not k.startswith("bootstrap")}
    assert got["output_ids"] == _post(servers["single"].url, "/generate", plain)["output_ids"]
    assert_pool_conserved(servers["decode"])


def test_killing_the_decode_server_leaves_the_prefill_serving(gateway, servers):
    """The prefill server's room for a killed decode server times out; its pages come back,
    and it keeps serving."""
    decode, prefill = servers["decode"], servers["prefill"]
    body = {"input_ids": list(range(10, 60)), "sampling_params": GREEDY_8,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": servers["bootstrap"],
            "bootstrap_room": 7}  # fmt: skip
    decode.proc.send_signal(signal.SIGKILL)
    decode.proc.wait(timeout=30)
    r = httpx.post(prefill.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200  # docs/disaggregation.md says why not 500
    reason = r.json()["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "no decode server asked" in reason["message"], r.text
    assert_pool_conserved(prefill)
    plain = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    assert len(_post(prefill.url, "/generate", plain)["output_ids"]) == 3
