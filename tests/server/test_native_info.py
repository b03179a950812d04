"""SGLang 0.5's information endpoints on a real `radixrt launch` with the default model:
/server_info, /model_info (and their /get_* aliases), /health_generate, /version, /tokenize and
/detokenize."""

from __future__ import annotations

import os

import httpx
import pytest

import radixrt

pytestmark = pytest.mark.slow


def get(server, path: str) -> httpx.Response:
    return httpx.get(server.url + path, timeout=60)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def test_server_info_has_sglang_names_and_the_old_alias(server):
    info = get(server, "/server_info").json()
    old = get(server, "/get_server_info").json()
    assert set(info) == set(old)
    assert info["version"] == radixrt.__version__
    assert "api_key" not in info
    assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1
    assert info["internal_states"][0]["max_total_num_tokens"] == info["max_total_num_tokens"]
    assert info["zmq_frontend_address"].startswith("tcp://127.0.0.1:")


def test_model_info_reports_the_loaded_file_and_sglang_fields(server):
    info = get(server, "/model_info").json()
    assert get(server, "/get_model_info").json() == info
    # The default model: its .gguf file, which a client can load a tokenizer from.
    assert info["model_path"].endswith(".gguf") and os.path.isfile(info["model_path"])
    assert info["model_path"] != info["served_model_name"]
    assert info["tokenizer_path"] == info["model_path"]
    assert info["is_generation"] is True
    assert info["model_type"] == "llama"
    assert info["architectures"] == ["LlamaForCausalLM"]
    assert info["weight_version"] == "default"
    assert "preferred_sampling_params" in info
    assert "<|im_start|>" in info["chat_template"]


def test_the_reported_model_path_loads_the_servers_tokenizer(server):
    from transformers import AutoTokenizer

    path = get(server, "/model_info").json()["model_path"]
    tokenizer = AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    text = "The capital of France is Paris."
    served = post(server, "/tokenize", {"prompt": text}).json()
    assert served["tokens"] == tokenizer.encode(text)


def test_health_generate_and_version(server):
    assert get(server, "/health_generate").status_code == 200
    assert get(server, "/version").json() == {"version": radixrt.__version__}


def test_tokenize_and_detokenize_round_trip(server):
    one = post(server, "/tokenize", {"prompt": "Hello world"}).json()
    assert one["count"] == len(one["tokens"]) > 0
    assert one["max_model_len"] == get(server, "/model_info").json()["context_length"]
    many = post(server, "/v1/tokenize", {"prompt": ["Hello world", "a b c"]}).json()
    assert many["tokens"][0] == one["tokens"] and many["count"] == [len(t) for t in many["tokens"]]
    back = post(server, "/detokenize", {"tokens": one["tokens"]}).json()
    assert back["text"] == "Hello world"
    both = post(server, "/v1/detokenize", {"tokens": many["tokens"]}).json()
    assert both["text"] == ["Hello world", "a b c"]


def test_tokenize_messages_renders_the_chat_template(server):
    messages = [{"role": "user", "content": "Hi there"}]
    ids = post(server, "/tokenize", {"messages": messages}).json()["tokens"]
    text = post(server, "/detokenize", {"tokens": ids, "skip_special_tokens": False}).json()
    assert "<|im_start|>user\nHi there<|im_end|>" in text["text"]
    assert text["text"].endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": []}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
def test_bad_tokenize_input_is_a_400_naming_the_field(server, path, body, field):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert get(server, "/health_generate").status_code == 200


def test_concate_and_append_request_is_acknowledged_and_checked(server):
    ok = post(server, "/concate_and_append_request", {"src_rids": ["a", "b"], "dst_rid": "c"})
    assert ok.status_code == 200 and ok.json()["success"] is True
    bad = post(server, "/concate_and_append_request", {"src_rids": "a", "dst_rid": "c"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "src_rids"
