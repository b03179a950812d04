"""The OpenAI-compatible API: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

Prompts are tokenized here (chat through the tokenizer's chat template) and sent to the engine
as token ids, so that the context-length checks can name the OpenAI field at fault and echo can
return the prompt. Streams are server-sent events in the OpenAI chunk format.

Choices, where the OpenAI API leaves room:
- `model` may be left out, or name the served model: its served name, "default", the model
  path, or any name whose last path component is that of one of these (the hub id
  "org/name" of a served "name"); any other name is a 404 with code "model_not_found", as
  OpenAI, vLLM and SGLang's GET /v1/models/{model} answer (SGLang's chat and completions
  ignore `model` instead). GET /v1/models/{model} takes the same names.
- Unknown fields are accepted and ignored (forward compatibility); the engine's extra sampling
  fields (top_k, min_p, ignore_eos, regex, ...) are accepted under SGLang's names, with
  min_tokens for min_new_tokens.
- max_tokens defaults to 16 for completions (OpenAI's default) and to the rest of the context
  for chat; prompt + max_tokens beyond the context length is a 400, never a silent cut, with
  OpenAI's code "context_length_exceeded" and words ("This model's maximum context length
  is N tokens"), which litellm maps to ContextWindowExceededError. Every error's `code` is
  a string (http_utils.STATUS_CODES), never the HTTP status that vLLM and SGLang put there.
- finish_reason is "stop", "length", or "abort" (the request was aborted); choices also carry
  SGLang's `matched_stop` (the stop string or token id that ended them).
- With n > 1, usage counts each prompt (and its cached tokens) once, from its first output.
- Text content parts are joined with newlines; "developer" messages render as "system".
- continue_final_message (vLLM's and SGLang's field) renders the conversation so that the
  model continues the last message, which must be the assistant's: no end of turn after it,
  no new assistant header; the response holds only the continuation. Without it, a last
  assistant message is history and a new assistant turn follows (OpenAI's and vLLM's reading;
  SGLang 0.5 re-labels it as a user message). add_generation_prompt: false (vLLM's field)
  renders without the new assistant header.
- Chat messages and stream deltas carry SGLang's `reasoning_content` (null: radixrt does not
  separate reasoning).
- Streamed text completions send one chunk per engine update and choice, as SGLang does: the
  first carries the echoed prompt and its logprobs, the last one its finish_reason with the
  last tokens' logprobs. Chat streams close each choice with an empty delta carrying
  finish_reason, as OpenAI and SGLang do.
- response_format "json_object" / "json_schema" and the regex / ebnf / json_schema extras are
  the engine's constraints (one at a time); the schema is enforced whatever `strict` says.
- Tools (see tool_calls.py): the tools reach the chat template whatever tool_choice says; a
  named function or "required" constrains the output and streams argument deltas; "auto"
  parses the model's own call format (streamed text is held back from the first sign of a
  call, and the calls come at the end); "auto" with an explicit constraint (response_format,
  regex, ...) is not parsed for calls. Assistant tool_calls arguments reach the template as
  objects, as transformers' templates expect. A template that renders the same prompt with
  and without the tools (SmolLM2's own) is reported: a warning in the server's log (once)
  and a `radixrt-warning` header on each such response; --chat-template replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixrt.entrypoints.http_utils import (
    CLIENT_CLOSED,
    await_or_disconnect,
    error_response,
    event_stream,
    exception_response,
    json_body,
    json_response,
    read_json,
)
from radixrt.entrypoints.openai import protocol as proto
from radixrt.entrypoints.openai import translate
from radixrt.entrypoints.openai.chat_template import chat_prompt, conversation_chars
from radixrt.entrypoints.openai.jobs import Job, chat_response, completion_response, engine_kwargs
from radixrt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixrt.entrypoints.openai.responses import add_responses_routes
from radixrt.entrypoints.openai.stream import TokenTexts, chat_events, completion_events
from radixrt.entrypoints.openai.tool_calls import MISTRAL_MARK, ToolPlan, plan_tools
from radixrt.errors import APIError, ModelNotFound
from radixrt.protocol.request_limits import (
    validate_prompt_len,
    validate_request_size,
    validate_token_ids,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # the OpenAI API's default for /v1/completions
WARNING_HEADER = "radixrt-warning"  # what a response says besides its body (OpenAI has no field)
TOOLS_IGNORED = (
    "the chat template does not render `tools`: the model is not shown the functions "
    "(tool_choice 'auto' will hardly ever call one); start the server with "
    "--chat-template chatml-tools, or a template of your own that renders them"
)
logger = logging.getLogger("radixrt.server")
# A prepared request: its Job, and the headers its response carries (WARNING_HEADER).
Prepared = tuple[Job, dict[str, str]]


def add_openai_routes(app: FastAPI, manager: Any, served_model_name: str) -> None:
    """Register the OpenAI routes on `app`, serving `manager` (a radixrt Engine) under the
    model name `served_model_name` (requests may also say "default" or leave model out)."""
    api = OpenAIServing(manager, served_model_name)
    add_responses_routes(app, api)  # POST /v1/responses, GET and DELETE /v1/responses/{id}
    app.add_api_route("/v1/models", api.models, methods=["GET"])
    app.add_api_route("/v1/models/{model:path}", api.retrieve_model, methods=["GET"])
    app.add_api_route(
        "/v1/completions",
        api.completions,
        methods=["POST"],
        openapi_extra=json_body("CompletionRequest"),
    )
    app.add_api_route(
        "/v1/chat/completions",
        api.chat_completions,
        methods=["POST"],
        openapi_extra=json_body("ChatCompletionRequest"),
    )


class OpenAIServing:
    def __init__(self, manager: Any, served_model_name: str) -> None:
        self.manager = manager
        self.model_name = served_model_name
        args = getattr(manager, "server_args", None)
        self.max_prompt_chars = getattr(args, "max_prompt_chars", None)
        self.owned_by = model_owner(getattr(args, "disaggregation_mode", "null"))
        self.created = int(time.time())
        self.texts = TokenTexts(manager.tokenizer) if manager.tokenizer is not None else None
        # Mistral's [TOOL_CALLS] is a special token: "auto" must keep it to find the calls.
        self.special_call_marker = _is_special(manager.tokenizer, MISTRAL_MARK)
        self.warned_tools_ignored = False  # the server's log says it once

    # -- routes -------------------------------------------------------------------------------
    async def models(self) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def retrieve_model(self, model: str) -> JSONResponse:
        if not self._serves(model):
            return _model_not_found(model, self.model_name)
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": self.owned_by,
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.manager.info.context_length,
        }

    def _serves(self, model: str | None) -> bool:
        """Whether `model` names the served model (see the module's docstring)."""
        candidates = (self.model_name, getattr(self.manager.info, "model_path", None))
        names: list[str] = [n for n in candidates if n]
        if model is None or model == "default" or model in names:
            return True
        return _last_part(model) in {_last_part(n) for n in names}

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, self._prepare_chat)

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, self._prepare_completion)

    async def _serve(self, request: Request, prepare: Callable[[dict], Prepared]) -> Response:
        names: dict[str, str] = {}
        try:
            texts = self.texts
            if texts is None:
                raise APIError(
                    "this server runs without a tokenizer (skip_tokenizer_init): "
                    "use /generate with input_ids",
                    None,
                )
            # Validating, rendering the chat template and tokenizing are CPU work: a worker
            # thread does them, so that a long conversation does not stall the event loop.
            body = await read_json(request)
            job, headers = await asyncio.to_thread(self._prepared, prepare, body)
            names = job.names
            response = await self._run(request, job, texts)
            response.headers.update(headers)
            return response
        except ModelNotFound as exc:
            return _model_not_found(exc.model, self.model_name)
        except asyncio.CancelledError:
            return Response(status_code=CLIENT_CLOSED)  # cancelled: nobody reads this
        except APIError as exc:
            return exception_response(exc)
        except ValueError as exc:
            return exception_response(translate.rename_engine_error(exc, names))
        except Exception as exc:  # noqa: BLE001 - overload, dead scheduler, client gone
            return exception_response(exc)

    def _prepared(self, prepare: Callable[[dict], Prepared], body: dict[str, Any]) -> Prepared:
        job, headers = prepare(body)
        job.kwargs = engine_kwargs(job, self.special_call_marker)
        return job, headers

    async def _run(self, request: Request, job: Job, texts: TokenTexts) -> Response:
        if job.req.stream:
            chunks = await self.manager.async_generate(**job.kwargs, stream=True)
            make = chat_events if job.chat else completion_events
            return await event_stream(chunks, lambda c: make(job, c, texts))
        outs = await await_or_disconnect(request, self.manager.async_generate(**job.kwargs))
        outs = outs if isinstance(outs, list) else [outs]
        build = chat_response if job.chat else completion_response
        # Logprobs of a long answer make a large body: built and encoded off the event loop.
        return await asyncio.to_thread(lambda: json_response(build(job, outs, texts)))

    # -- preparing requests -------------------------------------------------------------------
    def _prepare_chat(self, body: dict[str, Any]) -> Prepared:
        req = proto.parse_request(ChatCompletionRequest, body)
        self._check_model(req.model)
        names = translate.field_names(req)
        self._check_chars(conversation_chars(req), "messages")
        plan = _tool_plan(req)
        if plan is not None and plan.forced:
            names["json_schema"] = "tools"
        ids, tools_ignored = chat_prompt(self.manager.tokenizer, req)
        requested = req.max_completion_tokens
        requested = req.max_tokens if requested is None else requested
        # OpenAI's default: up to the end of the context (which the KV pool may cut shorter).
        default = self.manager.info.pool_tokens - len(ids)
        with translate.openai_names(names):
            max_new = self._max_new_tokens(len(ids), requested, default)
        job = Job(
            req,
            [ids],
            False,
            max_new,
            names,
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.model_name,
            tools=plan,
        )
        return job, self._tools_ignored_warning() if tools_ignored else {}

    def _tools_ignored_warning(self) -> dict[str, str]:
        """The response's header, and once per server a line in its log."""
        if not self.warned_tools_ignored:
            self.warned_tools_ignored = True
            logger.warning("a request passed tools, but %s", TOOLS_IGNORED)
        return {WARNING_HEADER: TOOLS_IGNORED}

    def _prepare_completion(self, body: dict[str, Any]) -> Prepared:
        req = proto.parse_request(CompletionRequest, body)
        self._check_model(req.model)
        names = translate.field_names(req)
        with translate.openai_names(names):
            ids, texts, batch = self._prompt_ids(req)
            max_new = min(
                self._max_new_tokens(len(p), req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS)
                for p in ids
            )
        job = Job(
            req,
            ids,
            batch,
            max_new,
            names,
            texts,
            id=f"cmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.model_name,
        )
        return job, {}

    def _check_chars(self, chars: int, param: str) -> None:
        """The prompt's length in characters is bounded before anything is tokenized."""
        limit = self.max_prompt_chars
        if limit is not None and chars > limit:
            raise APIError(
                f"{param} has {chars} characters, more than this server's limit "
                f"of {limit} (--max-prompt-chars)",
                param,
            )

    def _check_model(self, model: str | None) -> None:
        if not self._serves(model):
            raise ModelNotFound(model)

    def _prompt_ids(self, req: CompletionRequest) -> tuple[list[list[int]], list[str], bool]:
        """(ids per prompt, prompt texts for echo, batch?) for the four shapes of prompt."""
        tokenizer = self.manager.tokenizer
        prompt = req.prompt
        batch = isinstance(prompt, list) and not isinstance(prompt[0], int)
        prompts: list[Any] = list(prompt) if batch else [prompt]
        self._check_chars(sum(len(p) for p in prompts if isinstance(p, str)), "prompt")
        ids: list[list[int]] = []
        texts: list[str] = []
        info = self.manager.info
        for i, p in enumerate(prompts):
            p_ids = tokenizer.encode(p) if isinstance(p, str) else list(p)
            validate_prompt_len(len(p_ids), info.context_length)  # before each of 1e6 ids
            if not isinstance(p, str):
                where = f"prompt[{i}]" if batch else "prompt"
                validate_token_ids(p_ids, info.vocab_size, where, param="input_ids")
            ids.append(p_ids)
            if isinstance(p, str):
                texts.append(p)
            else:
                texts.append(tokenizer.decode(p) if req.echo else "")
        return ids, texts, batch

    def _max_new_tokens(self, prompt_len: int, requested: int | None, default: int) -> int:
        """max_new_tokens for one prompt: `requested`, or `default` cut to the room left in
        the context; ParamError (SGLang's names) when the request does not fit."""
        info = self.manager.info
        max_new = requested
        if max_new is None:
            max_new = max(1, min(default, info.context_length - prompt_len))
        validate_request_size(prompt_len, max_new, info.context_length, info.pool_tokens)
        return max_new


def model_owner(disaggregation_mode: str) -> str:
    """/v1/models' owned_by: "sglang" on a prefill or decode server, because SMG tells the
    runtime by it and, told anything else, probes /version, finds it, and drives the pair as
    vLLM workers, without the bootstrap fields (docs/openai.md); "radixrt" otherwise."""
    return "radixrt" if disaggregation_mode == "null" else "sglang"


def _model_not_found(model: str | None, served: str) -> JSONResponse:
    """OpenAI's 404 for an unknown model (code "model_not_found", as SGLang and vLLM)."""
    message = (
        f"The model {model!r} does not exist: this server serves {served!r} "
        "(also reachable as 'default')"
    )
    return error_response(message, "model", 404, code="model_not_found")


def _last_part(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]


def _tool_plan(req: ChatCompletionRequest) -> ToolPlan | None:
    """The request's tool plan; a forced call cannot share the output with another
    constraint, and "auto" under one is not parsed for calls."""
    tools = [tool.model_dump() for tool in req.tools] if req.tools else None
    plan = plan_tools(tools, req.tool_choice, req.parallel_tool_calls)
    fmt = req.response_format
    others = proto.constraint_extras(req) + (
        ["response_format"] if fmt is not None and fmt.type != "text" else []
    )
    if plan is not None and plan.forced and others:
        raise APIError(
            f"tool_choice {req.tool_choice!r} constrains the output to a tool call "
            f"and cannot be combined with {others}",
            "tool_choice",
        )
    if plan is not None and plan.mode == "auto" and others:
        plan = replace(plan, mode="none")
    return plan


def _is_special(tokenizer: Any, text: str) -> bool:
    """Whether `text` is one special added token of `tokenizer` (dropped when decoding with
    skip_special_tokens)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return any(tok.content == text and tok.special for tok in added.values())
