"""The server-sent events of a streamed Responses request (POST /v1/responses, stream: true),
in OpenAI's order, each with its sequence_number:

    response.created, response.in_progress,
    per output item: response.output_item.added, then for a message
        response.content_part.added, response.output_text.delta..., response.output_text.done,
        response.content_part.done
    or for a function call
        response.function_call_arguments.delta..., response.function_call_arguments.done,
    then response.output_item.done; and last response.completed with the whole response
    (status "incomplete" when max_output_tokens cut it, as vLLM and SGLang send it).

Each event goes out with its name in an `event:` field too, as OpenAI and vLLM send them: SSE
fields may come in any order within an event, so the name follows the `data:` line that
http_utils.sse_stream writes (the stream then ends with radixrt's `data: [DONE]`).

The chat path's stream deltas (openai_stream.ChoiceDeltas: content, or a tool call's start and
argument text under the request's tool plan) are what is translated here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from radixrt.entrypoints.http_utils import Chunks, dumps
from radixrt.entrypoints.openai import translate
from radixrt.entrypoints.openai.responses_protocol import (
    final_status,
    function_call_item,
    message_item,
    output_text_part,
    usage,
)
from radixrt.entrypoints.openai.stream import ChoiceDeltas
from radixrt.entrypoints.openai.tool_calls import ToolCall


async def response_events(
    turn: Any,
    model: str,
    chunks: Chunks,
    on_done: Callable[[Any, dict[str, Any]], None],
) -> AsyncIterator[str]:
    """The SSE text of the events of `turn` (openai_responses.Turn) from the engine's
    `chunks`; `on_done` gets the finished response (to store it) before response.completed
    goes out."""
    async for event in _events(turn, model, chunks, on_done):
        yield f"{dumps(event)}\nevent: {event['type']}"


async def _events(
    turn: Any,
    model: str,
    chunks: Chunks,
    on_done: Callable[[Any, dict[str, Any]], None],
) -> AsyncIterator[dict[str, Any]]:
    events = ResponseEvents(turn, model)
    deltas = ChoiceDeltas(turn.job.tools)
    for event in events.start():
        yield event
    async with aclosing(chunks):  # closing it aborts a request the client left
        async for chunk in chunks:
            meta = chunk["meta_info"]
            pieces = deltas.feed(chunk["text"])
            if meta["finish_reason"] is not None:
                pieces += deltas.finish()
            for piece in pieces:
                for event in events.delta(piece):
                    yield event
            if meta["finish_reason"] is not None:
                closing, response = events.finished(meta, deltas.has_calls)
                for event in closing:
                    yield event
                on_done(turn, response)
                yield events.event("response.completed", response=response)
                return


class ResponseEvents:
    """The events of one streamed response: which output item is open, what it holds, the
    items finished, and the sequence number of the next event."""

    def __init__(self, turn: Any, model: str) -> None:
        self.turn, self.model = turn, model
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # finished output items
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.text = ""  # the open message's text, or the open call's arguments

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        out = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return out

    def start(self) -> list[dict[str, Any]]:
        response = self.turn.response(self.model)
        return [
            self.event("response.created", response=response),
            self.event("response.in_progress", response=response),
        ]

    def delta(self, piece: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat delta: {"content"} or {"tool_calls": [one call's start or
        argument text]}."""
        if "content" in piece:
            out = [] if self._open_is("message") else self._open(message_item("", "in_progress"))
            return out + self._more_text("response.output_text.delta", piece["content"])
        call = piece["tool_calls"][0]
        out = []
        if "id" in call:  # a new call begins
            start = ToolCall(call["function"]["name"], "", call["id"])
            out = self._open(function_call_item(start, "in_progress"))
        arguments = call["function"].get("arguments") or ""
        return out + self._more_text("response.function_call_arguments.delta", arguments)

    def finished(
        self, meta: dict[str, Any], calls: bool
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(the events that close what is open, an empty message if nothing was output; the
        final response)."""
        status, incomplete = final_status(translate.finish_reason(meta, calls))
        item_status = "incomplete" if status == "incomplete" else "completed"
        out = []
        if self.open is None and not self.items:
            out = self._open(message_item("", "in_progress"))
        out += self._close(item_status)
        return out, self.turn.response(
            self.model,
            output=self.items,
            status=status,
            incomplete_details=incomplete,
            usage=usage(meta),
        )

    # -- items --------------------------------------------------------------------------------
    def _open_is(self, kind: str) -> bool:
        return self.open is not None and self.open["type"] == kind

    def _where(self) -> dict[str, Any]:
        assert self.open is not None, "an item is open"
        return {"item_id": self.open["id"], "output_index": len(self.items)}

    def _open(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._close("completed")
        self.open, self.text = item, ""
        index = len(self.items)
        if item["type"] != "message":
            return [*out, self.event("response.output_item.added", output_index=index, item=item)]
        added = {**item, "content": []}
        return [
            *out,
            self.event("response.output_item.added", output_index=index, item=added),
            self.event(
                "response.content_part.added",
                **self._where(),
                content_index=0,
                part=output_text_part(""),
            ),
        ]

    def _more_text(self, kind: str, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        self.text += text
        extra = {"content_index": 0, "logprobs": []} if kind.endswith("text.delta") else {}
        return [self.event(kind, **self._where(), **extra, delta=text)]

    def _close(self, status: str) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        where = self._where()
        if self.open["type"] == "message":
            part = output_text_part(self.text)
            item = {**self.open, "status": status, "content": [part]}
            out = [
                self.event(
                    "response.output_text.done", **where, content_index=0, text=self.text,
                    logprobs=[],
                ),
                self.event("response.content_part.done", **where, content_index=0, part=part),
            ]  # fmt: skip
        else:
            item = {**self.open, "status": status, "arguments": self.text}
            out = [
                self.event("response.function_call_arguments.done", **where, arguments=self.text)
            ]
        out.append(self.event("response.output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        self.open = None
        return out
