"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{response_id}.

A request is translated into a chat completion (responses_protocol.py) and served by the chat
path of api.py (its validation, chat template, tool plan, constraints and context
checks); its result becomes the response object, or the Responses stream events
(responses_stream.py). docs/responses_api.md says what is supported.

Stored responses (store: true, OpenAI's default) live in memory, in a least-recently-used
store of MAX_STORED_RESPONSES; each keeps its own turn (input and output as chat messages)
and the id of the response it continued, so previous_response_id rebuilds the conversation
by walking that chain. A response not stored (store: false), deleted or evicted cannot be
continued: 400 with code "previous_response_not_found".
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
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
from radixrt.entrypoints.openai import translate
from radixrt.entrypoints.openai.jobs import Job
from radixrt.entrypoints.openai.responses_protocol import (
    ResponsesRequest,
    assistant_message,
    chat_body,
    final_status,
    function_call_item,
    input_messages,
    message_item,
    new_response_id,
    parse_responses_request,
    response_object,
    responses_error,
    usage,
)
from radixrt.entrypoints.openai.responses_stream import response_events
from radixrt.entrypoints.openai.tool_calls import read_calls
from radixrt.errors import APIError

MAX_STORED_RESPONSES = 1024  # responses kept for previous_response_id and GET (LRU)


def add_responses_routes(app: FastAPI, api: Any) -> None:
    """Register the Responses routes on `app`, served through `api` (openai/api.py's
    OpenAIServing: its model names and its chat path)."""
    serving = ResponsesServing(api)
    body = json_body("ResponsesRequest")
    app.add_api_route("/v1/responses", serving.create, methods=["POST"], openapi_extra=body)
    app.add_api_route("/v1/responses/{response_id}", serving.retrieve, methods=["GET"])
    app.add_api_route("/v1/responses/{response_id}", serving.delete, methods=["DELETE"])


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the response object, as GET returns it
    messages: list[dict[str, Any]]  # this turn's input and output, as chat messages
    previous_id: str | None


class ResponseStore:
    """A bounded LRU map of response ids to StoredResponse; thread-safe (requests are
    prepared on worker threads)."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self.items: OrderedDict[str, StoredResponse] = OrderedDict()
        self.lock = threading.Lock()

    def put(self, resp_id: str, stored: StoredResponse) -> None:
        with self.lock:
            self.items[resp_id] = stored
            while len(self.items) > self.capacity:
                self.items.popitem(last=False)

    def get(self, resp_id: str) -> StoredResponse | None:
        with self.lock:
            stored = self.items.get(resp_id)
            if stored is not None:
                self.items.move_to_end(resp_id)
            return stored

    def delete(self, resp_id: str) -> bool:
        with self.lock:
            return self.items.pop(resp_id, None) is not None

    def conversation(self, resp_id: str) -> list[dict[str, Any]]:
        """The chat messages of the chain ending at `resp_id`, oldest first (every response
        on it is touched, so a conversation in use is not evicted)."""
        turns: list[list[dict[str, Any]]] = []
        next_id: str | None = resp_id
        while next_id is not None:
            stored = self.get(next_id)
            if stored is None:
                raise _previous_not_found(resp_id, next_id)
            turns.append(stored.messages)
            next_id = stored.previous_id
        return [message for turn in reversed(turns) for message in turn]


def _previous_not_found(resp_id: str, missing: str) -> APIError:
    earlier = "" if missing == resp_id else f" (its earlier response {missing!r} is gone)"
    return APIError(
        f"Previous response with id {resp_id!r} not found{earlier}: only responses created "
        f"with store true are kept, the last {MAX_STORED_RESPONSES} of them",
        "previous_response_id",
        code="previous_response_not_found",
    )


@dataclass
class Turn:
    """One validated Responses request and the chat job that serves it."""

    req: ResponsesRequest
    job: Job
    headers: dict[str, str]
    new_messages: list[dict[str, Any]]  # the request's input as chat messages
    id: str = field(default_factory=new_response_id)
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, model: str, **state: Any) -> dict[str, Any]:
        return response_object(self.req, self.id, self.created_at, model, **state)


class ResponsesServing:
    def __init__(self, api: Any) -> None:
        self.api = api
        self.store = ResponseStore()

    # -- routes -------------------------------------------------------------------------------
    async def create(self, request: Request) -> Response:
        names: dict[str, str] = {}
        try:
            if self.api.texts is None:
                raise APIError("this server runs without a tokenizer (skip_tokenizer_init)")
            body = await read_json(request)
            turn = await asyncio.to_thread(self._prepare, body)
            if turn is None:
                return _model_not_found(body.get("model"), self.api.model_name)
            names = turn.job.names
            response = await self._run(request, turn)
            response.headers.update(turn.headers)
            return response
        except asyncio.CancelledError:
            return Response(status_code=CLIENT_CLOSED)  # cancelled: nobody reads this
        except APIError as exc:
            return exception_response(responses_error(exc))
        except ValueError as exc:
            return exception_response(responses_error(translate.rename_engine_error(exc, names)))
        except Exception as exc:  # noqa: BLE001 - overload, dead scheduler, client gone
            return exception_response(exc)

    async def retrieve(self, response_id: str) -> Response:
        stored = self.store.get(response_id)
        if stored is None:
            return _response_not_found(response_id)
        return json_response(stored.response)

    async def delete(self, response_id: str) -> Response:
        if not self.store.delete(response_id):
            return _response_not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    # -- serving ------------------------------------------------------------------------------
    def _prepare(self, body: dict[str, Any]) -> Turn | None:
        """The request's Turn (None: it names another model); APIError when it is bad."""
        req = parse_responses_request(body)
        if not self.api._serves(req.model):
            return None
        history = []
        if req.previous_response_id is not None:
            history = self.store.conversation(req.previous_response_id)
        new = input_messages(req)
        # The chat path: validation, template, tool plan, limits, engine arguments.
        job, headers = self.api._prepared(self.api._prepare_chat, chat_body(req, history + new))
        turn = Turn(req, job, headers, new)
        job.kwargs["rid"] = turn.id  # /abort_request takes the id the client knows
        return turn

    async def _run(self, request: Request, turn: Turn) -> Response:
        manager, model = self.api.manager, self.api.model_name
        if turn.req.stream:
            chunks = await manager.async_generate(**turn.job.kwargs, stream=True)
            return await event_stream(
                chunks, lambda c: response_events(turn, model, c, on_done=self._keep)
            )
        outs = await await_or_disconnect(request, manager.async_generate(**turn.job.kwargs))
        out = outs[0] if isinstance(outs, list) else outs
        meta = out["meta_info"]
        parsed = read_calls(turn.job.tools, out["text"])
        items = [function_call_item(call) for call in parsed.calls]
        finish = translate.finish_reason(meta, bool(parsed.calls))
        status, incomplete = final_status(finish)
        if parsed.content or not parsed.calls:
            item_status = "incomplete" if status == "incomplete" else "completed"
            items.insert(0, message_item(parsed.content or "", item_status))
        response = turn.response(
            model, output=items, status=status, incomplete_details=incomplete, usage=usage(meta)
        )
        self._keep(turn, response)
        return json_response(response)

    def _keep(self, turn: Turn, response: dict[str, Any]) -> None:
        """Store a finished response, unless its request said store: false."""
        if turn.req.store is False:
            return
        messages = [*turn.new_messages, assistant_message(response["output"])]
        self.store.put(turn.id, StoredResponse(response, messages, turn.req.previous_response_id))


def _model_not_found(model: Any, served: str) -> Response:
    return error_response(
        f"The model {model!r} does not exist: this server serves {served!r} "
        "(also reachable as 'default')",
        "model",
        404,
        code="model_not_found",
    )


def _response_not_found(response_id: str) -> Response:
    return error_response(
        f"No response found with id {response_id!r} (responses created with store false "
        f"are not kept, and the store holds the last {MAX_STORED_RESPONSES})",
        "response_id",
        404,
        code="not_found",
    )
