"""The HTTP side of prefill/decode disaggregation, as SMG (`--pd-disaggregation`) drives a
pair of SGLang servers: the bodies it re-serializes (extra defaults, bootstrap fields as
scalars or lists) reach each scheduler message as its own Bootstrap on /generate, chat and
completions; a server that is not disaggregated refuses them; /v1/models says "sglang" on a
prefill or decode server (SMG's runtime detection); /model_info, /server_info, /v1/loads and
/metrics report the mode and the transfer counters; a decode server refuses a bootstrap_host
outside --disaggregation-bootstrap-peers with a 400 naming it, and no route shows the keys.

The app runs in-process over a stand-in engine that plans each request exactly as the engine
does (frontend/validation.build_requests) and answers one canned output per message: no
model, no scheduler."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from smg_bodies import SMG_ROOM, smg_generate_body
from starlette.testclient import TestClient

from radixrt.entrypoints import metrics_scheduler
from radixrt.entrypoints.http_server import ServerState, build_app
from radixrt.entrypoints.metrics import ServerMetrics
from radixrt.frontend.validation import build_requests
from radixrt.protocol.messages import Bootstrap
from radixrt.protocol.request_input import engine_call_request
from radixrt.server_args import ServerArgs

HOST, PORT, OWN_PORT = "127.0.0.1", 38998, 8998
ASK = [{"role": "user", "content": "Hi"}]
# What the scheduler's get_stats() says (the disagg_* keys as the scheduler's part sends them).
STATS: dict[str, Any] = {
    "pool_tokens": 512,
    "free_tokens": 400,
    "evictable_tokens": 12,
    "running": 3,
    "queued": 1,
    "grammar_queue": 0,
    "beam_groups": 0,
    "generated_tokens": 0,
    "cache_hit_rate": 0.0,
    **{key: 0 for key in metrics_scheduler._COUNTERS},
    "histograms": {
        name: {"bounds": [1.0], "counts": [0, 0], "sum": 0.0}
        for name in metrics_scheduler._HISTOGRAMS
    },
    "disagg_queue": 4,
    "disagg_transfers": 8,
    "disagg_transfer_failures": 1,
    "disagg_transfer_seconds": 2.0,
    "disagg_transfer_bytes": 6_000_000_000,
    "disagg_transfer_tokens": 900,
    "disagg_reused_tokens": 300,
}


class ByteTokenizer:
    """A token per UTF-8 byte; the chat template joins the messages' contents."""

    added_tokens_decoder: dict = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode(errors="replace")

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, **kw) -> str:
        return "\n".join(m["content"] for m in messages)


class StandInEngine:
    """Enough of Engine for build_app; `sent` holds the messages of the last request."""

    error = None

    def __init__(self, mode: str) -> None:
        self.server_args = ServerArgs(disaggregation_mode=mode)
        self.tokenizer = ByteTokenizer()
        self.info = SimpleNamespace(
            context_length=256, vocab_size=256, pool_tokens=512, model_path="m", eos_token_ids=[0]
        )
        self.sent: list = []

    def get_stats(self) -> dict[str, Any]:
        return STATS

    def get_server_info(self) -> dict[str, Any]:
        return {"max_total_num_tokens": 512}

    async def async_generate_request(self, req) -> Any:
        planned, batch = build_requests(self, req)
        self.sent = [p.msg for p in planned]
        outs = [_output(p.msg) for p in planned]
        return outs if batch or len(outs) > 1 else outs[0]

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, **fields):
        req = engine_call_request(prompt, sampling_params, input_ids, fields)
        return await self.async_generate_request(req)


def _output(msg) -> dict[str, Any]:
    meta = {
        "id": msg.rid,
        "prompt_tokens": len(msg.input_ids),
        "completion_tokens": 1,
        "cached_tokens": 0,
        "finish_reason": {"type": "length", "length": 1},
    }
    return {"text": "!", "output_ids": [33], "meta_info": meta}


def client(mode: str) -> tuple[TestClient, StandInEngine]:
    engine = StandInEngine(mode)
    args = engine.server_args
    state = ServerState(engine, args, "m", ServerMetrics(engine.get_stats, "m"), healthy=True)
    return TestClient(build_app(state), raise_server_exceptions=False), engine


@pytest.fixture(scope="module")
def decode() -> tuple[TestClient, StandInEngine]:
    return client("decode")


def boots(engine: StandInEngine) -> list[Bootstrap | None]:
    return [msg.bootstrap for msg in engine.sent]


def test_chat_with_n_2_gives_each_choice_the_room_smg_listed(decode):
    http, engine = decode
    body = {
        "model": "m",
        "messages": ASK,
        "n": 2,
        "max_tokens": 1,
        "logprobs": False,
        "bootstrap_host": [HOST, HOST],
        "bootstrap_port": [PORT, PORT],
        "bootstrap_room": [71, 13],
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2
    assert boots(engine) == [Bootstrap(HOST, PORT, 71), Bootstrap(HOST, PORT, 13)]


def test_the_responses_api_passes_the_bootstrap_on(decode):
    http, engine = decode
    body = {"input": "Hi", "max_output_tokens": 1, "bootstrap_host": HOST, "bootstrap_room": 8}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert boots(engine) == [Bootstrap(HOST, OWN_PORT, 8)]


def test_completions_lists_per_prompt_and_a_null_port(decode):
    http, engine = decode
    body = {
        "prompt": ["hi", "yo"],
        "max_tokens": 1,
        "echo": False,
        "bootstrap_host": HOST,
        "bootstrap_port": None,
        "bootstrap_room": [5, 6],
    }
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert boots(engine) == [Bootstrap(HOST, OWN_PORT, 5), Bootstrap(HOST, OWN_PORT, 6)]


def test_generate_takes_smgs_body_and_counts_a_scalar_room_over_n(decode):
    http, engine = decode
    body = smg_generate_body(
        sampling_params={"max_new_tokens": 1, "n": 2}, bootstrap_host=HOST, bootstrap_port=PORT
    )
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert [b.room for b in boots(engine) if b] == [SMG_ROOM, SMG_ROOM + 1]
    # Without bootstrap fields (a health check), the same server serves it plainly.
    r = http.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200 and boots(engine) == [None]


@pytest.mark.parametrize(
    "path,body,param,words",
    [
        ("/generate", {"text": "Hi", "bootstrap_room": -1}, "bootstrap_room", "0..9223"),
        (
            "/generate",
            {"text": "Hi", "sampling_params": {"beam_width": 2}},
            "beam_width",
            "beam search (beam_width 2) does not run on a disaggregated server",
        ),
        ("/v1/chat/completions", {"messages": ASK, "bootstrap_port": 0}, "bootstrap_port", ""),
        ("/v1/chat/completions", {"messages": ASK, "bootstrap_room": "7"}, "bootstrap_room", ""),
        (
            "/generate",
            {"text": "Hi", "bootstrap_host": "evil.example"},
            "bootstrap_host",
            "--disaggregation-bootstrap-peers allows 127.0.0.1 (any port)",
        ),
        (
            "/v1/completions",
            {"prompt": "Hi", "bootstrap_host": "10.0.0.9", "bootstrap_port": 8998},
            "bootstrap_host",
            "bootstrap_host '10.0.0.9' with bootstrap_port 8998 is not a prefill server",
        ),
        (
            "/v1/completions",
            {"prompt": ["a", "b"], "bootstrap_room": [1, 2, 3]},
            "bootstrap_room",
            "3 entries for 2 prompt(s)",
        ),
    ],
)
def test_a_bad_bootstrap_is_a_400_naming_its_field(decode, path, body, param, words):
    http, _ = decode
    body = {"bootstrap_host": HOST, "bootstrap_room": 9, **body}
    r = http.post(path, json=body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and words in error["message"], r.text


def test_a_server_that_is_not_disaggregated_refuses_bootstrap_fields():
    http, _ = client("null")
    for path, body in [
        ("/generate", {"text": "Hi"}),
        ("/v1/chat/completions", {"messages": ASK}),
        ("/v1/completions", {"prompt": "Hi"}),
        ("/v1/responses", {"input": "Hi"}),
    ]:
        r = http.post(path, json={**body, "bootstrap_host": HOST, "bootstrap_room": 1})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "bootstrap_host", r.text
        assert "not disaggregated (--disaggregation-mode null)" in error["message"]
    assert http.get("/v1/models").json()["data"][0]["owned_by"] == "radixrt"
    assert http.get("/model_info").json()["disaggregation_mode"] == "null"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_a_pd_server_reports_sglang_ownership_and_its_mode(mode):
    http, _ = client(mode)
    assert http.get("/v1/models").json()["data"][0]["owned_by"] == "sglang"
    assert http.get("/v1/models/m").json()["owned_by"] == "sglang"
    assert http.get("/model_info").json()["disaggregation_mode"] == mode
    info = http.get("/server_info").json()
    assert info["disaggregation_mode"] == mode
    assert info["disaggregation_bootstrap_port"] == OWN_PORT
    assert "api_key" not in info and "disaggregation_bootstrap_key" not in info
    loads = http.get("/v1/loads?include=core,disagg,queues,memory").json()["loads"][0]
    queue = {"prefill_queue_reqs": 4 if mode == "prefill" else 0}
    queue["decode_queue_reqs"] = 4 if mode == "decode" else 0
    assert loads["disagg_mode"] == mode and queue.items() <= loads.items()
    assert loads["kv_transfer_latency_ms"] == pytest.approx(250.0)  # 2 s / 8 transfers
    assert loads["kv_transfer_speed_gb_s"] == pytest.approx(3.0)  # 6 GB / 2 s
    assert "disagg_mode" not in http.get("/v1/loads").json()["loads"][0]  # core only


def test_metrics_export_the_transfer_counters(decode):
    http, _ = decode
    text = http.get("/metrics").text
    samples = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert {
        "radixrt:disagg_queue_reqs": 4,
        "radixrt:disagg_transfers_total": 8,
        "radixrt:disagg_transfer_failures_total": 1,
        "radixrt:disagg_transfer_bytes_total": 6e9,
        "radixrt:disagg_transfer_seconds_total": 2.0,
        "radixrt:disagg_transfer_tokens_total": 900,
        "radixrt:disagg_reused_tokens_total": 300,
    }.items() <= samples.items()
