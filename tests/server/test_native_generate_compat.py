"""SGLang's native /generate against a real `radixrt launch` (float32, the default model, with
--incremental-streaming-output): every field of SGLang's GenerateReqInput at its null value,
unsupported ones refused by name, stop_regex, return_text_in_logprobs, token_ids_logprob,
output_token_logprobs_length, incremental streams, and the same fields over ZeroMQ."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixrt.lang.backends.zmq_client import FrontendError, ZmqClient

pytestmark = pytest.mark.slow
PROMPT = "Once upon a time, in a small village by the sea, there lived"
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
SGLANG_FIELDS_AT_NULL = [
    "rid",
    "session_id",
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "mm_hashes",
    "mm_content_hashes",
    "use_audio_in_video",
    "video_config",
    "watermark",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_sampling_mask",
    "sampling_logprobs_mode",
    "return_text_in_logprobs",
    "return_flat_raw_top_logprobs",
    "return_flat_raw_output_top_logprobs",
    "return_flat_raw_top_logprobs_b64",
    "stream",
    "log_metrics",
    "return_hidden_states",
    "return_routed_experts",
    "routed_experts_start_len",
    "return_indexer_topk",
    "modalities",
    "session_params",
    "lora_path",
    "lora_id",
    "custom_logit_processor",
    "positional_embed_overrides",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "bootstrap_pair_key",
    "decode_tp_size",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
    "routing_key",
    "conversation_id",
    "http_worker_ipc",
    "background",
    "require_reasoning",
    "max_thinking_tokens",
    "priority",
    "extra_key",
    "no_logs",
    "custom_labels",
    "return_bytes",
    "return_entropy",
    "return_prompt_token_ids",
    "external_trace_header",
    "received_time",
    "need_wait_for_mm_inputs",
    "num_items_assigned",
    "encoder_urls",
    "max_dynamic_patch",
    "min_dynamic_patch",
    "image_max_dynamic_patch",
    "video_max_dynamic_patch",
    "images_config",
    "mm_processor_kwargs",
    "multi_item_delimiter_indices",
    "token_indices_to_pool",
    "cache_salt",
    "kv_hints",
]
# SGLang's defaults where they are not null, as its DSL and clients send them.
SGLANG_DEFAULTS = {
    "return_text_in_logprobs": False,
    "stream": False,
    "log_metrics": True,
    "return_hidden_states": False,
    "return_routed_experts": False,
    "routed_experts_start_len": 0,
    "background": False,
    "no_logs": False,
    "require_reasoning": False,
    "return_bytes": False,
    "return_entropy": False,
    "return_prompt_token_ids": False,
    "use_audio_in_video": False,
}
SAMPLING_AT_NULL = [
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "beam_width",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "watermark",
]
UNSUPPORTED = [
    ("lora_path", "/adapters/a"),
    ("image_data", "http://x/cat.png"),
    ("session_params", {"id": "s"}),
    ("custom_logit_processor", "{}"),
    ("return_hidden_states", True),
    ("bootstrap_pair_key", "pair-1"),
    ("priority", 3),
    ("input_embeds", [[0.5, 0.5]]),
]


@pytest.fixture(scope="module")
def server(launch_server):
    return launch_server(
        "--dtype",
        "float32",
        "--max-total-tokens",
        "8192",
        "--log-level",
        "warning",
        "--incremental-streaming-output",
    )


@pytest.fixture(scope="module")
def tokenizer(default_tokenizer):
    return default_tokenizer


@pytest.fixture(scope="module")
def full(server) -> dict:
    """The greedy continuation of PROMPT, no stop."""
    return post(server, {"text": PROMPT, "sampling_params": GREEDY})


def post(server, body: dict, status: int = 200):
    r = httpx.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def stream(server, body: dict) -> list[dict]:
    with httpx.stream(
        "POST", server.url + "/generate", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_every_sglang_field_is_accepted_at_its_null_and_default_value(server):
    nulls = {name: None for name in SGLANG_FIELDS_AT_NULL}
    params = {**{name: None for name in SAMPLING_AT_NULL}, "max_new_tokens": 2}
    for body in (nulls, SGLANG_DEFAULTS):
        out = post(server, {**body, "text": "Hi", "sampling_params": params})
        assert out["meta_info"]["completion_tokens"] >= 1


@pytest.mark.parametrize("name,value", UNSUPPORTED)
def test_an_unsupported_field_with_a_value_is_a_400_naming_it(server, name, value):
    err = post(server, {"text": "Hi", name: value}, 400)["error"]
    assert f"{name} is not supported by this server" in err["message"]
    assert err["param"] == name


def test_unknown_names_are_a_400_naming_them(server):
    err = post(server, {"text": "Hi", "lora_paths": "a"}, 400)["error"]
    assert "'lora_paths'" in err["message"] and err["param"] == "lora_paths"
    err = post(server, {"text": "Hi", "sampling_params": {"beam": 2}}, 400)["error"]
    assert "'beam'" in err["message"]
    err = post(server, {"text": "Hi", "sampling_params": {"stop_regex": "(["}}, 400)["error"]
    assert "stop_regex" in err["message"]


def _word_regex(text: str) -> tuple[str, re.Match]:
    """A regex for a whole word in the middle of the text, and its match in it."""
    word = next(w for w in re.findall(r"[A-Za-z]{4,}", text[12 : len(text) * 2 // 3]))
    pattern = r"\b" + word + r"\b"
    return pattern, re.search(pattern, text)


def test_stop_regex_ends_generation_and_never_shows_in_the_text(server, full):
    text = full["text"]
    pattern, m = _word_regex(text)
    params = {**GREEDY, "stop_regex": pattern}
    out = post(server, {"text": PROMPT, "sampling_params": params})
    assert out["text"] == text[: m.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert out["meta_info"]["completion_tokens"] < full["meta_info"]["completion_tokens"]
    chunks = stream(
        server, {"text": PROMPT, "sampling_params": {**params, "stop_regex": [pattern]}}
    )
    assert "".join(c["text"] for c in chunks) == text[: m.start()]  # deltas only append
    kept = post(server, {"text": PROMPT, "sampling_params": {**params, "no_stop_trim": True}})
    assert kept["text"] == text[: m.end()]


def test_return_text_in_logprobs_gives_each_tokens_text(server, tokenizer):
    out = post(
        server,
        {
            "text": PROMPT,
            "sampling_params": {**GREEDY, "max_new_tokens": 5},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 3,
            "return_text_in_logprobs": True,
        },
    )
    meta = out["meta_info"]
    entries = (
        meta["input_token_logprobs"]
        + meta["output_token_logprobs"]
        + [
            e
            for top in meta["input_top_logprobs"] + meta["output_top_logprobs"]
            if top
            for e in top
        ]
    )
    assert len(entries) > 2 * meta["prompt_tokens"]
    for _, token_id, text in entries:
        assert text == tokenizer.decode([token_id])
    assert meta["output_token_logprobs_length"] == meta["completion_tokens"] == 5
    plain = post(
        server, {"text": PROMPT, "sampling_params": {"max_new_tokens": 3}, "return_logprob": True}
    )["meta_info"]
    assert {e[2] for e in plain["output_token_logprobs"]} == {None}
    assert plain["output_token_logprobs_length"] == 3


def test_token_ids_logprob_and_per_prompt_logprob_fields(server):
    ids = [11, 1000]
    out = post(
        server,
        {
            "text": ["Hello there", PROMPT],
            "return_logprob": [True, False],
            "top_logprobs_num": [1, 0],
            "token_ids_logprob": ids,
            "sampling_params": {"max_new_tokens": 3},
            "rid": "batch",
            "return_prompt_token_ids": True,
        },
    )
    first, second = out
    assert first["meta_info"]["id"] == "batch_0" and second["meta_info"]["id"] == "batch_1"
    per_position = first["meta_info"]["output_token_ids_logprobs"]
    assert len(per_position) == 3 and all([e[1] for e in p] == ids for p in per_position)
    assert all(e[0] <= 0 for p in per_position for e in p)
    assert "output_token_logprobs" not in second["meta_info"]
    assert len(first["prompt_token_ids"]) == first["meta_info"]["prompt_tokens"]


def test_incremental_stream_chunks_carry_only_the_new_part(server, full):
    body = {
        "text": PROMPT,
        "sampling_params": GREEDY,
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    whole = post(server, body)
    chunks = stream(server, body)
    assert len(chunks) > 2
    assert "".join(c["text"] for c in chunks) == whole["text"] == full["text"]
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    for c in chunks:
        meta = c["meta_info"]
        assert len(meta["output_token_logprobs"]) == len(c["output_ids"])
        assert len(meta["output_top_logprobs"]) == len(c["output_ids"])
    joined = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    assert [e[1] for e in joined] == [e[1] for e in whole["meta_info"]["output_token_logprobs"]]
    assert chunks[-1]["meta_info"]["output_token_logprobs_length"] == len(whole["output_ids"])


def _requests_counted(server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "radixrt:num_requests_total"
    )


def test_log_metrics_false_is_not_counted(server):
    before = _requests_counted(server)
    post(server, {"text": "Hi", "sampling_params": {"max_new_tokens": 1}, "log_metrics": False})
    assert _requests_counted(server) == before
    post(server, {"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
    assert _requests_counted(server) == before + 1


def test_the_zeromq_frontend_takes_the_same_fields(server, full, tokenizer):
    address = httpx.get(server.url + "/server_info", timeout=30).json()["zmq_frontend_address"]
    pattern, m = _word_regex(full["text"])
    params = {**GREEDY, "stop_regex": pattern}
    with ZmqClient(address) as client:
        out = client.generate(
            text=PROMPT,
            sampling_params=params,
            return_logprob=True,
            logprob_start_len=0,
            top_logprobs_num=2,
            return_text_in_logprobs=True,
            token_ids_logprob=[11],
        )
        assert out["text"] == full["text"][: m.start()]
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "stop", "matched": pattern}
        assert all(t == tokenizer.decode([i]) for _, i, t in meta["output_token_logprobs"])
        assert meta["output_token_logprobs_length"] == meta["completion_tokens"]
        assert len(meta["output_token_ids_logprobs"]) == meta["completion_tokens"]
        chunks = list(
            client.generate_stream(text=PROMPT, sampling_params=params, return_logprob=True)
        )
        assert "".join(c["text"] for c in chunks) == out["text"]
        with pytest.raises(FrontendError, match="lora_path is not supported") as e:
            client.generate(text="Hi", lora_path="/adapters/a")
        assert e.value.status == 400
        with pytest.raises(FrontendError, match="return_text_in_logprobs") as e:
            client.generate(text="Hi", return_text_in_logprobs="yes")
        assert e.value.status == 400
        with pytest.raises(TypeError, match="'lora_paths'"):
            client.generate(text="Hi", lora_paths="a")


def test_stream_interval_sends_a_chunk_every_k_tokens(server, full):
    chunks = stream(server, {"text": PROMPT, "sampling_params": {**GREEDY, "stream_interval": 5}})
    sizes = [len(c["output_ids"]) for c in chunks]
    assert all(n >= 5 for n in sizes[:-1]) and sum(sizes) == len(full["output_ids"]), sizes
    assert "".join(c["text"] for c in chunks) == full["text"]


def test_undecodable_zeromq_messages_are_dropped_and_the_frontend_keeps_serving(server):
    import msgspec
    import zmq

    address = httpx.get(server.url + "/server_info", timeout=30).json()["zmq_frontend_address"]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        for junk in (
            b"\xc1 not msgpack",
            msgspec.msgpack.encode([1, 2]),
            msgspec.msgpack.encode({"type": "client_generate", "api_key": 5}),
        ):
            sock.send(junk)
        assert sock.poll(1000) == 0  # nothing to answer: no request_id to answer to
    finally:
        sock.close()
        ctx.term()
    with ZmqClient(address) as client:
        out = client.generate(text="Hi", sampling_params={"max_new_tokens": 2})
        assert out["meta_info"]["completion_tokens"] == 2
