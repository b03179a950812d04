"""One generation request as a client sends it: SGLang's `GenerateReqInput`, field for field.

`/generate`, `Engine.generate` / `async_generate` and the ZeroMQ frontend (`ZmqClient`) all
build this one struct and hand it on, so the field list lives here and nowhere else. Each field
of SGLang's class is one of three kinds (the tables below):
- implemented: it behaves as in SGLang;
- informational: accepted with any value, because it asks for nothing that changes the output
  here (a trace header, a routing key on a server with one worker, ...);
- unsupported: accepted while it carries its null/default value (None, False, 0, "", [] or
  {}), else a `ParamError` naming it ("lora_path is not supported by this server").
A name SGLang does not know is a `ParamError` too. Types are checked by msgspec
(`check_types`); shapes and ranges by `radixrt.frontend.validation.build_requests`.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import msgspec

from radixrt.errors import ParamError


class GenerateReqInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """SGLang 0.5's GenerateReqInput. A list value of a per-request field gives one value per
    prompt of a batch. Defaults are SGLang's."""

    # -- the prompt, and how to sample (implemented) --
    text: Any = None  # str, or a list of str (a batch)
    input_ids: Any = None  # list[int], or a list of list[int] (a batch)
    sampling_params: Any = None  # dict (or SamplingParams), or one per prompt
    rid: str | list[str] | None = None
    stream: bool | None = False
    # -- logprobs (implemented) --
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[Any] | None = None  # ids for all prompts, or one list per prompt
    return_text_in_logprobs: bool | None = False
    return_prompt_token_ids: bool | None = False
    log_metrics: bool | None = True  # False: the request is not counted in /metrics
    # -- prefill/decode disaggregation (implemented: radixrt/frontend/bootstrap.py) --
    # A value, or a list (one per prompt, or per prompt and sample); see frontend/bootstrap.py.
    bootstrap_host: str | list[str] | None = None  # the prefill server's host
    bootstrap_port: int | list[int | None] | None = None  # its bootstrap port; null: ours
    bootstrap_room: int | list[int] | None = None  # the transfer's id on both servers
    # -- informational (accepted, nothing to do here) --
    session_id: str | None = None
    no_logs: bool | None = False  # radixrt logs no request contents anyway
    routing_key: str | None = None
    conversation_id: str | None = None
    http_worker_ipc: str | None = None
    external_trace_header: dict[str, Any] | None = None
    received_time: float | None = None
    routed_dp_rank: int | None = None  # 0 or None: there is one data-parallel rank
    data_parallel_rank: int | None = None  # SGLang's deprecated alias of routed_dp_rank
    # -- unsupported (accepted at their null/default value) --
    input_embeds: Any = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    mm_hashes: Any = None
    mm_content_hashes: Any = None
    use_audio_in_video: bool | None = False
    video_config: dict[str, Any] | None = None
    modalities: list[Any] | None = None
    watermark: Any = None
    return_sampling_mask: bool | list[bool] | None = None
    sampling_logprobs_mode: Any = None
    return_flat_raw_top_logprobs: bool | None = False
    return_flat_raw_output_top_logprobs: bool | None = False
    return_flat_raw_top_logprobs_b64: bool | None = False
    return_hidden_states: Any = False
    return_routed_experts: bool | None = False
    routed_experts_start_len: int | None = 0
    return_indexer_topk: bool | None = False
    session_params: dict[str, Any] | None = None
    lora_path: Any = None
    lora_id: Any = None
    custom_logit_processor: Any = None
    positional_embed_overrides: Any = None
    bootstrap_pair_key: Any = None
    decode_tp_size: Any = None
    disagg_prefill_dp_rank: int | None = None
    background: bool | None = False
    require_reasoning: bool | None = False
    max_thinking_tokens: int | None = None
    priority: int | None = None
    extra_key: str | list[str] | None = None
    custom_labels: dict[str, Any] | None = None
    return_bytes: bool | None = False
    return_entropy: bool | None = False
    need_wait_for_mm_inputs: bool | None = None
    num_items_assigned: dict[str, Any] | None = None
    encoder_urls: list[Any] | None = None
    max_dynamic_patch: int | None = None
    min_dynamic_patch: int | None = None
    image_max_dynamic_patch: int | None = None
    video_max_dynamic_patch: int | None = None
    images_config: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    multi_item_delimiter_indices: list[Any] | None = None
    token_indices_to_pool: list[Any] | None = None
    cache_salt: str | list[str] | None = None
    kv_hints: Any = None


FIELDS: tuple[str, ...] = GenerateReqInput.__struct_fields__
IMPLEMENTED = frozenset(
    {
        "text",
        "input_ids",
        "sampling_params",
        "rid",
        "stream",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "token_ids_logprob",
        "return_text_in_logprobs",
        "return_prompt_token_ids",
        "log_metrics",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
    }
)
INFORMATIONAL = frozenset(
    {
        "session_id",
        "no_logs",
        "routing_key",
        "conversation_id",
        "http_worker_ipc",
        "external_trace_header",
        "received_time",
        "routed_dp_rank",
        "data_parallel_rank",
    }
)
UNSUPPORTED = frozenset(FIELDS) - IMPLEMENTED - INFORMATIONAL
# Why, where a word helps the user more than "not supported".
_WHY = {
    "lora_path": "it serves one model, without LoRA adapters",
    "lora_id": "it serves one model, without LoRA adapters",
    "image_data": "it serves text-only models",
    "video_data": "it serves text-only models",
    "audio_data": "it serves text-only models",
    "input_embeds": "give text or input_ids",
    "session_params": "send the whole prompt; the radix cache reuses the shared prefix",
    "priority": "it schedules without priorities",
    "custom_logit_processor": "it runs no user code",
}
_DEFAULTS = {name: getattr(GenerateReqInput(), name) for name in FIELDS}


def make_request(**fields: Any) -> GenerateReqInput:
    """The struct from keyword arguments; TypeError naming an unknown one (the Python APIs)."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise TypeError(
            f"unknown request field(s) {unknown} (not fields of SGLang's "
            f"GenerateReqInput); allowed: {', '.join(sorted(FIELDS))}"
        )
    return GenerateReqInput(**fields)


def from_dict(body: dict[str, Any]) -> GenerateReqInput:
    """A request from a JSON body; ParamError for an unknown name or a wrong type. A top-level
    `model` is ignored: routers in front of workers (SGLang's gateway, SMG) add one."""
    body = {k: v for k, v in body.items() if k != "model"}
    unknown = [k for k in body if k not in _DEFAULTS]
    if unknown:
        raise ParamError(unknown[0], _unknown_message(unknown[0]))
    return _convert(body)


def check_types(req: GenerateReqInput) -> GenerateReqInput:
    """The same request with every field's type checked (a struct built in Python skips the
    check msgspec makes when it decodes)."""
    return _convert(msgspec.structs.asdict(req))


def check_supported(req: GenerateReqInput) -> None:
    """ParamError naming the first unsupported field that asks for something."""
    for name in sorted(UNSUPPORTED):
        if not is_unset(getattr(req, name), _DEFAULTS[name]):
            why = _WHY.get(name)
            raise ParamError(
                name, f"{name} is not supported by this server" + (f" ({why})" if why else "")
            )
    for name in ("routed_dp_rank", "data_parallel_rank"):
        if getattr(req, name) not in (None, 0):
            raise ParamError(
                name,
                f"{name} must be 0 or null: this server runs one "
                f"data-parallel rank, got {getattr(req, name)!r}",
            )


def is_unset(value: Any, default: Any) -> bool:
    """None, False, 0, the default, an empty value, or a list of such (one per prompt of a
    batch)."""
    if value is None or value is False or value == default:
        return True
    if type(value) in (int, float) and value == 0:  # e.g. priority 0: no priority asked for
        return True
    if isinstance(value, (str, list, tuple, dict)) and len(value) == 0:
        return True
    if isinstance(value, list):
        return all(is_unset(v, default) for v in value)
    return False


def _convert(data: dict[str, Any]) -> GenerateReqInput:
    try:
        return msgspec.convert(data, GenerateReqInput)
    except msgspec.ValidationError as e:
        found = re.search(r"\$\.(\w+)", str(e))
        name = found.group(1) if found else None
        raise ParamError(name, f"invalid {name or 'request'}: {e}") from None


def _unknown_message(name: str) -> str:
    close = difflib.get_close_matches(name, FIELDS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"unknown field {name!r} (not a field of SGLang's GenerateReqInput).{hint} "
        f"Allowed: {', '.join(sorted(FIELDS))}"
    )


def engine_call_request(
    prompt: Any, sampling_params: Any, input_ids: Any, fields: dict[str, Any]
) -> GenerateReqInput:
    """Engine.generate's keywords as the request struct (SGLang's `prompt` is the struct's
    `text`); TypeError naming an unknown keyword."""
    text = fields.pop("text", None)
    if prompt is not None and text is not None:
        raise TypeError("generate(): give prompt or text, not both")
    return make_request(
        text=prompt if prompt is not None else text,
        sampling_params=sampling_params,
        input_ids=input_ids,
        **fields,
    )
