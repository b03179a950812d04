"""SGLang 0.5's native information endpoints: /server_info and /model_info (with the older
/get_* names as aliases), /health_generate, /version, /tokenize and /detokenize (also under
/v1/, as SGLang), and the /concate_and_append_request SGLang's client sends when forks join.
Generation itself is /generate in http_server.py."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

import radixrt
from radixrt.entrypoints.http_utils import exception_response, json_body, json_response, read_json
from radixrt.errors import APIError

HEALTH_GENERATE_TIMEOUT_S = 20.0  # a one-token generation on an idle server takes far less


# The bodies of the routes below, for /openapi.json (the functions at the end check them).
class TokenizeReq(BaseModel):
    """Exactly one of prompt or messages."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["prompt"]}, {"required": ["messages"]}]}
    )
    prompt: str | list[str] | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True


class DetokenizeReq(BaseModel):
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class ConcateAndAppendReq(BaseModel):
    src_rids: list[str]
    dst_rid: str


SGLANG_BODIES = (TokenizeReq, DetokenizeReq, ConcateAndAppendReq)


def add_info_routes(app: FastAPI, state: Any) -> None:
    """Register the routes on `app`; `state` is the server's ServerState."""
    engine = state.engine

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        path = served_model_path(engine)
        return model_info_of(state, path, await asyncio.to_thread(model_identity, path))

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        args = dataclasses.asdict(state.args)
        for secret in ("api_key", "disaggregation_bootstrap_key"):
            args.pop(secret)
        info = await asyncio.to_thread(engine.get_server_info)
        stats = {k: v for k, v in info.items() if k not in args}
        return {
            **args,
            **info,
            "version": radixrt.__version__,
            "served_model_name": state.served_model_name,
            # SGLang reports live scheduler state per data-parallel rank; radixrt has one.
            "internal_states": [stats],
            "zmq_frontend_address": state.zmq_address,
        }

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": radixrt.__version__}

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return await _health_generate(state)

    routes: list[tuple[str, _Compute, type[BaseModel]]] = [
        ("/concate_and_append_request", concat_and_append_body, ConcateAndAppendReq)
    ]
    routes += [(path, tokenize_body, TokenizeReq) for path in ("/tokenize", "/v1/tokenize")]
    routes += [(path, detokenize_body, DetokenizeReq) for path in ("/detokenize", "/v1/detokenize")]
    for path, compute, body in routes:
        app.post(path, openapi_extra=json_body(body.__name__))(
            _json_route(engine, state.args, compute)
        )


# A native route's body: compute(engine, body, server_args) -> the JSON answer.
_Compute = Callable[[Any, dict[str, Any], Any], dict[str, Any]]


def _json_route(engine: Any, args: Any, compute: _Compute) -> Any:
    """A POST route answering `compute(engine, body, args)` as JSON, or the error it raised;
    computed on a worker thread (tokenizing a long prompt must not stall the event loop)."""

    def answer(body: dict[str, Any]) -> Response:
        return json_response(compute(engine, body, args))

    async def route(request: Request) -> Response:
        try:
            return await asyncio.to_thread(answer, await read_json(request))
        except Exception as exc:  # noqa: BLE001 - every error becomes an HTTP error
            return exception_response(exc)

    return route


def served_model_path(engine: Any) -> str:
    """The path the model was loaded from (for the default model: its .gguf file, which
    transformers' and SGLang's get_tokenizer load), never the bare served name."""
    from radixrt.loader.default_model import default_model_path

    return engine.info.model_path or default_model_path()


def model_info_of(
    state: Any, model_path: str, identity: tuple[str | None, list[str] | None]
) -> dict[str, Any]:
    """SGLang's /model_info fields, plus what a client needs to render prompts as
    /v1/chat/completions does with jinja2 alone (the chat template and special tokens)."""
    engine, args = state.engine, state.args
    tokenizer = engine.tokenizer
    model_type, architectures = identity
    return {
        "model_path": model_path,
        "tokenizer_path": args.tokenizer_path or model_path,
        "served_model_name": state.served_model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "gguf" if model_path.endswith(".gguf") else "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": args.disaggregation_mode,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": model_type,
        "architectures": architectures,
        "context_length": engine.info.context_length,
        "vocab_size": engine.info.vocab_size,
        "chat_template": getattr(tokenizer, "chat_template", None),
        "bos_token": getattr(tokenizer, "bos_token", None),
        "eos_token": getattr(tokenizer, "eos_token", None),
    }


@functools.lru_cache(maxsize=4)
def model_identity(model_path: str) -> tuple[str | None, list[str] | None]:
    """(transformers model_type, HF architectures) of a model folder or .gguf file, read from
    its config.json or GGUF metadata (no weights); (None, None) when it cannot be told."""
    path = Path(model_path)
    try:
        if path.suffix == ".gguf":
            return _gguf_identity(path)
        config = json.loads((path / "config.json").read_text())
        return config.get("model_type"), config.get("architectures")
    except (OSError, ValueError, KeyError):
        return None, None


def _gguf_identity(path: Path) -> tuple[str | None, list[str] | None]:
    from radixrt.loader.gguf_metadata import hf_identity  # torch-free, unlike the loader

    model_type, architecture = hf_identity(path)
    return model_type, [architecture]


async def _health_generate(state: Any) -> Response:
    """200 once a one-token generation went through every process (SGLang's meaning)."""
    engine = state.engine
    if not state.healthy or engine.error is not None:
        return Response(status_code=503)
    ids = [engine.info.eos_token_ids[0] if engine.info.eos_token_ids else 0]
    try:
        await asyncio.wait_for(
            engine.async_generate(
                input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0}
            ),
            HEALTH_GENERATE_TIMEOUT_S,
        )
    except Exception:  # noqa: BLE001 - any failure means unhealthy
        return Response(status_code=503)
    return Response(status_code=200)


def tokenize_body(engine: Any, body: dict[str, Any], args: Any) -> dict[str, Any]:
    """/tokenize: exactly one of `prompt` (a string or a list of strings) or `messages` (chat
    turns, rendered by the model's chat template with the generation prompt), at most
    args.max_prompt_chars characters (of text, or of the messages as JSON)."""
    tokenizer = _tokenizer(engine)
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise APIError(
            "give exactly one of 'prompt' (a string or a list of strings) or "
            "'messages' (chat turns)",
            "prompt",
        )
    _check_chars(
        prompt if messages is None else messages,
        args.max_prompt_chars,
        "prompt" if messages is None else "messages",
    )
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise APIError(
            f"add_special_tokens must be true or false, got {add_special!r}", "add_special_tokens"
        )
    limit = engine.info.context_length
    if messages is not None:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise APIError("messages must be a list of {role, content} objects", "messages")
        try:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # noqa: BLE001 - no template, or the template's own raise
            raise APIError(
                f"the chat template cannot render these messages: {e}", "messages"
            ) from None
        ids = tokenizer.encode(text, add_special_tokens=False)
        return {"tokens": ids, "count": len(ids), "max_model_len": limit}
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_special_tokens=add_special)
        return {"tokens": ids, "count": len(ids), "max_model_len": limit}
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        lists = [tokenizer.encode(p, add_special_tokens=add_special) for p in prompt]
        return {"tokens": lists, "count": [len(x) for x in lists], "max_model_len": limit}
    raise APIError(
        f"prompt must be a string or a list of strings, got {type(prompt).__name__}", "prompt"
    )


def _check_chars(value: Any, limit: int, param: str) -> None:
    """APIError when `value` (a string, a list of strings, or chat turns) is longer than
    `limit` characters, counted before anything is tokenized."""
    if isinstance(value, str):
        size = len(value)
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        size = sum(map(len, value))
    else:
        size = len(json.dumps(value, ensure_ascii=False))
    if size > limit:
        raise APIError(
            f"{param} has {size} characters, more than this server's limit of "
            f"{limit} (--max-prompt-chars)",
            param,
        )


def detokenize_body(engine: Any, body: dict[str, Any], args: Any = None) -> dict[str, Any]:
    """/detokenize: `tokens` (a list of ids, or a list of such lists) back to text."""
    tokenizer = _tokenizer(engine)
    tokens = body.get("tokens")
    skip = body.get("skip_special_tokens", True)
    if not isinstance(skip, bool):
        raise APIError(
            f"skip_special_tokens must be true or false, got {skip!r}", "skip_special_tokens"
        )
    vocab = engine.info.vocab_size
    if isinstance(tokens, list) and tokens and all(isinstance(t, list) for t in tokens):
        for ids in tokens:
            _check_ids(ids, vocab)
        return {"text": [tokenizer.decode(ids, skip_special_tokens=skip) for ids in tokens]}
    _check_ids(tokens, vocab)
    return {"text": tokenizer.decode(tokens, skip_special_tokens=skip)}


def concat_and_append_body(engine: Any, body: dict[str, Any], args: Any = None) -> dict[str, Any]:
    """SGLang's client calls this when a fork joins with mode="concate_and_append" (its
    "parallel encoding"), after it has appended the branches' text itself. radixrt does not
    splice the branches' KV together: the next request holds the joined text, its common
    prefix comes from the radix cache and the rest is prefilled. So this only checks the body
    and says so."""
    src, dst = body.get("src_rids"), body.get("dst_rid")
    if not isinstance(src, list) or not all(isinstance(r, str) for r in src):
        raise APIError("src_rids must be a list of request ids (strings)", "src_rids")
    if not isinstance(dst, str):
        raise APIError("dst_rid must be a request id (a string)", "dst_rid")
    return {
        "success": True,
        "message": "nothing to splice: the joined text is prefilled "
        "over the radix cache by the next request",
    }


def _check_ids(ids: Any, vocab: int) -> None:
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
    ):
        raise APIError(
            f"tokens must be a list of token ids in [0, {vocab}) (or a list of such lists)",
            "tokens",
        )


def _tokenizer(engine: Any) -> Any:
    if engine.tokenizer is None:
        raise APIError("this server runs without a tokenizer (skip_tokenizer_init)")
    return engine.tokenizer
