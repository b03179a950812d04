"""GenerateReqInput carries every field of SGLang's; unsupported fields are refused only when
they ask for something; unknown names and wrong types name the field."""

from __future__ import annotations

import msgspec
import pytest
from smg_bodies import SMG_ROOM, smg_generate_body

from radixrt.errors import ParamError
from radixrt.protocol import request_input as ri
from radixrt.protocol.messages import ClientGenerate, decode_from_client, encode

# The fields of sglang/srt/managers/io_struct.py GenerateReqInput in SGLang 0.5.23.
SGLANG_FIELDS = """rid session_id text input_ids input_embeds image_data video_data audio_data
mm_hashes mm_content_hashes use_audio_in_video video_config sampling_params watermark
return_logprob logprob_start_len top_logprobs_num token_ids_logprob return_sampling_mask
sampling_logprobs_mode return_text_in_logprobs return_flat_raw_top_logprobs
return_flat_raw_output_top_logprobs return_flat_raw_top_logprobs_b64 stream log_metrics
return_hidden_states return_routed_experts routed_experts_start_len return_indexer_topk
modalities session_params lora_path lora_id custom_logit_processor positional_embed_overrides
bootstrap_host bootstrap_port bootstrap_room bootstrap_pair_key decode_tp_size routed_dp_rank
data_parallel_rank disagg_prefill_dp_rank routing_key conversation_id http_worker_ipc
background require_reasoning max_thinking_tokens priority extra_key no_logs custom_labels
return_bytes return_entropy return_prompt_token_ids external_trace_header received_time
need_wait_for_mm_inputs num_items_assigned encoder_urls max_dynamic_patch min_dynamic_patch
image_max_dynamic_patch video_max_dynamic_patch images_config mm_processor_kwargs
multi_item_delimiter_indices token_indices_to_pool cache_salt kv_hints""".split()

# A value that asks for something, per unsupported field.
ASKING = {
    "input_embeds": [[0.1, 0.2]],
    "image_data": "http://x/cat.png",
    "video_data": "v.mp4",
    "audio_data": "a.wav",
    "mm_hashes": ["ab"],
    "mm_content_hashes": ["sha256:00"],
    "use_audio_in_video": True,
    "video_config": {"fps": 2},
    "modalities": ["image"],
    "watermark": {"key": 1},
    "return_sampling_mask": True,
    "sampling_logprobs_mode": "support",
    "return_flat_raw_top_logprobs": True,
    "return_flat_raw_output_top_logprobs": True,
    "return_flat_raw_top_logprobs_b64": True,
    "return_hidden_states": True,
    "return_routed_experts": True,
    "routed_experts_start_len": 3,
    "return_indexer_topk": True,
    "session_params": {"id": "s1"},
    "lora_path": "/adapters/a",
    "lora_id": "a",
    "custom_logit_processor": "{}",
    "positional_embed_overrides": [1],
    "bootstrap_pair_key": "k",
    "decode_tp_size": 2,
    "disagg_prefill_dp_rank": 1,
    "background": True,
    "require_reasoning": True,
    "max_thinking_tokens": 10,
    "priority": 5,
    "extra_key": "tenant",
    "custom_labels": {"team": "a"},
    "return_bytes": True,
    "return_entropy": True,
    "need_wait_for_mm_inputs": True,
    "num_items_assigned": {"image": [1]},
    "encoder_urls": ["http://e"],
    "max_dynamic_patch": 4,
    "min_dynamic_patch": 1,
    "image_max_dynamic_patch": 4,
    "video_max_dynamic_patch": 4,
    "images_config": {"a": 1},
    "mm_processor_kwargs": {"a": 1},
    "multi_item_delimiter_indices": [3],
    "token_indices_to_pool": [2],
    "cache_salt": "salt",
    "kv_hints": {"v": 1},
}


def test_the_struct_has_exactly_sglangs_fields():
    assert sorted(ri.FIELDS) == sorted(SGLANG_FIELDS)
    assert set(SGLANG_FIELDS) == ri.IMPLEMENTED | ri.INFORMATIONAL | ri.UNSUPPORTED
    assert sorted(ri.UNSUPPORTED) == sorted(ASKING)


@pytest.mark.parametrize("name", SGLANG_FIELDS)
def test_every_field_is_accepted_at_its_null_and_default_value(name):
    default = getattr(ri.GenerateReqInput(), name)
    for value in (None, default):
        req = ri.from_dict({"text": "x", name: value} if name != "text" else {"text": "x"})
        ri.check_supported(ri.check_types(req))


@pytest.mark.parametrize("name", sorted(ASKING))
def test_an_unsupported_field_that_asks_for_something_names_itself(name):
    req = ri.from_dict({"text": "x", name: ASKING[name]})
    with pytest.raises(ParamError, match=f"{name} is not supported") as e:
        ri.check_supported(req)
    assert e.value.param == name


def test_empty_zero_and_all_null_batch_values_count_as_unset():
    ri.check_supported(
        ri.from_dict(
            {
                "text": ["a", "b"],
                "lora_path": [None, None],
                "extra_key": "",
                "modalities": [],
                "image_data": [],
                "priority": 0,
            }
        )
    )


def test_dp_rank_zero_is_the_one_rank_and_others_are_refused():
    ri.check_supported(ri.from_dict({"text": "x", "data_parallel_rank": 0, "routed_dp_rank": 0}))
    with pytest.raises(ParamError, match="data_parallel_rank must be 0"):
        ri.check_supported(ri.from_dict({"text": "x", "data_parallel_rank": 1}))


def test_unknown_names_and_wrong_types_name_the_field():
    with pytest.raises(ParamError, match="'lora_paths'.*Did you mean 'lora_path'"):
        ri.from_dict({"text": "x", "lora_paths": "a"})
    with pytest.raises(ParamError, match=r"stream") as e:
        ri.from_dict({"text": "x", "stream": "yes"})
    assert e.value.param == "stream"
    with pytest.raises(ParamError) as e:
        ri.check_types(ri.GenerateReqInput(text="x", return_text_in_logprobs="yes"))
    assert e.value.param == "return_text_in_logprobs"
    with pytest.raises(TypeError, match="unknown request field.*'prompt'"):
        ri.make_request(prompt="x")


def test_a_routers_model_field_is_ignored():
    # SMG adds "model" to the /generate bodies it forwards to a worker.
    req = ri.from_dict({"text": "hi", "model": "unknown"})
    assert req.text == "hi" and not hasattr(req, "model")


def test_smgs_re_serialized_generate_body_is_accepted():
    body = smg_generate_body()  # what SMG 1.13 forwarded to both servers of a pair
    req = ri.check_types(ri.from_dict(body))
    ri.check_supported(req)
    assert (req.bootstrap_host, req.bootstrap_port) == ("127.0.0.1", 38998)
    assert req.bootstrap_room == SMG_ROOM


@pytest.mark.parametrize(
    "name,value",
    [
        ("bootstrap_room", "7"),
        ("bootstrap_room", True),
        ("bootstrap_room", [1, None]),
        ("bootstrap_port", "8998"),
        ("bootstrap_host", 3),
        ("bootstrap_host", ["h", None]),
    ],
)
def test_bootstrap_fields_of_the_wrong_type_name_the_field(name, value):
    with pytest.raises(ParamError) as e:
        ri.from_dict({"text": "x", name: value})
    assert e.value.param == name


def test_per_prompt_lists_of_logprob_fields_are_accepted():
    req = ri.from_dict(
        {
            "text": ["a", "b"],
            "return_logprob": [True, False],
            "logprob_start_len": [0, -1],
            "top_logprobs_num": [2, 0],
            "token_ids_logprob": [[1, 2], None],
        }
    )
    assert req.return_logprob == [True, False] and req.token_ids_logprob == [[1, 2], None]


def test_the_struct_crosses_the_zeromq_socket_whole():
    req = ri.make_request(
        text="hi",
        sampling_params={"stop_regex": ["a+b"]},
        return_logprob=True,
        return_text_in_logprobs=True,
        token_ids_logprob=[3],
        rid="r1",
        stream=True,
    )
    got = decode_from_client(encode(ClientGenerate("id", req)))
    assert isinstance(got, ClientGenerate) and got.request == req
    bad = msgspec.msgpack.encode(
        {"type": "client_generate", "request_id": "id", "request": {"stream": "yes"}}
    )
    with pytest.raises(msgspec.ValidationError, match="stream"):
        decode_from_client(bad)
