"""Frontend-side state of one request: collects the scheduler's deltas into SGLang-shaped dicts.

The text comes with each delta, filled in by the detokenizer (its process, or its thread in an
in-process engine); without a tokenizer (skip_tokenizer_init) there is none and the text is "".
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from radixrt.protocol.messages import ReqOutput

_TOKEN_KEYS = ("input_token_logprobs", "output_token_logprobs")
_TOP_KEYS = ("input_top_logprobs", "output_top_logprobs")
_IDS_KEYS = ("input_token_ids_logprobs", "output_token_ids_logprobs")


class ReqState:
    """`token_text` (return_text_in_logprobs) gives a token's text for the logprob triples;
    `ids_logprob`: the request asked for token_ids_logprob; `prompt_ids`: the prompt's ids,
    when the result carries them (return_prompt_token_ids); `log_metrics`: /metrics counts
    it; `stream_interval`: a stream chunk once this many new tokens are there (and at the
    end)."""

    def __init__(
        self,
        rid: str,
        return_logprob: bool,
        loop: asyncio.AbstractEventLoop | None = None,
        index: int = 0,
        queues: tuple[queue.Queue, asyncio.Queue | None] | None = None,
        *,
        token_text: Callable[[int], str] | None = None,
        ids_logprob: bool = False,
        prompt_ids: list[int] | None = None,
        log_metrics: bool = True,
        stream_interval: int = 1,
    ) -> None:
        self.rid = rid
        self.return_logprob = return_logprob
        self.token_text = token_text
        self.ids_logprob = ids_logprob
        self.prompt_ids = prompt_ids
        self.log_metrics = log_metrics
        self.stream_interval = stream_interval
        self.unsent: dict[str, Any] | None = None  # the stream's chunk not yet yielded
        self.created = time.perf_counter()
        self.created_wall = time.time()  # compared with the scheduler's wall-clock stamps
        self.last_output_wall: float | None = None  # when the last delta arrived (metrics)
        self.output_ids: list[int] = []
        self.text = ""
        self.finished = False
        self.last: ReqOutput | None = None
        # Logprob entries so far, as SGLang's (logprob, token_id, text or None) triples.
        self.logprobs: dict[str, list] = {k: [] for k in _TOKEN_KEYS + _TOP_KEYS + _IDS_KEYS}
        self.index = index  # position in the caller's list of outputs
        # Outputs are pushed from the dispatcher thread as (state, item) pairs: into a thread
        # queue for sync callers, an asyncio queue (through call_soon_threadsafe) for async
        # ones. Requests streamed through one iterator share their queues.
        self.loop = loop
        self.sync_q, self.async_q = queues or new_queues(loop)

    def push(self, item: ReqOutput | BaseException) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.async_queue().put_nowait, (self, item))
        else:
            self.sync_q.put((self, item))

    def async_queue(self) -> asyncio.Queue:
        """The asyncio queue of a state made with an event loop (async callers)."""
        assert self.async_q is not None, "only a state made with a loop is awaited"
        return self.async_q

    def wait(self) -> dict[str, Any]:
        """For a sync caller: the result, once finished; raises the error pushed instead."""
        while not self.finished:
            self.absorb(raise_if_error(self.sync_q.get()[1]))
        return self.result()

    async def wait_async(self) -> dict[str, Any]:
        while not self.finished:
            self.absorb(raise_if_error((await self.async_queue().get())[1]))
        return self.result()

    def indexed(self, chunk: dict[str, Any], count: int) -> dict[str, Any]:
        """With several requests in one stream, "index" says whose chunk it is."""
        if count > 1:
            chunk["index"] = self.index
        return chunk

    def absorb(self, out: ReqOutput) -> dict[str, Any]:
        """Fold one delta in; return the chunk a stream yields for it (delta text and ids)."""
        self.last = out
        self.output_ids.extend(out.new_output_ids)
        for key in _TOKEN_KEYS:
            self.logprobs[key].extend(self._triple(p) for p in getattr(out, key) or [])
        for key in _TOP_KEYS + _IDS_KEYS:
            self.logprobs[key].extend(
                None if t is None else [self._triple(p) for p in t] for t in getattr(out, key) or []
            )
        delta = out.text or ""
        self.text += delta
        self.finished = out.finished
        chunk = {
            "text": delta,
            "output_ids": list(out.new_output_ids),
            "meta_info": self.meta_info(),
        }
        if self.prompt_ids is not None:
            chunk["prompt_token_ids"] = list(self.prompt_ids)
        return chunk

    def stream_chunk(self, out: ReqOutput) -> dict[str, Any] | None:
        """absorb for a stream: the chunk to yield now, or None while fewer than
        stream_interval new tokens wait (their text and ids join the next chunk)."""
        chunk = self.absorb(out)
        if self.unsent is not None:
            chunk["text"] = self.unsent["text"] + chunk["text"]
            chunk["output_ids"] = self.unsent["output_ids"] + chunk["output_ids"]
        if out.finished or len(chunk["output_ids"]) >= self.stream_interval:
            self.unsent = None
            return chunk
        self.unsent = chunk
        return None

    def meta_info(self) -> dict[str, Any]:
        out = self.last
        meta: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": out.prompt_tokens if out else 0,
            "completion_tokens": out.completion_tokens if out else 0,
            "cached_tokens": out.cached_tokens if out else 0,
            "finish_reason": out.finish_reason if out else None,
            "e2e_latency": time.perf_counter() - self.created,
        }
        if out is not None and out.spec is not None:
            meta.update(_spec_meta(out.completion_tokens, *out.spec))
        if out is not None and out.beam_score is not None:
            meta["beam_score"] = out.beam_score
            meta["beam_cum_logprob"] = out.beam_cum_logprob
        if self.return_logprob:
            keys = _TOKEN_KEYS + _TOP_KEYS + (_IDS_KEYS if self.ids_logprob else ())
            meta.update({k: list(self.logprobs[k]) for k in keys})
            # As SGLang's tokenizer manager: the number of output logprob entries so far.
            meta["output_token_logprobs_length"] = len(self.logprobs["output_token_logprobs"])
        return meta

    def result(self) -> dict[str, Any]:
        out = {
            "text": self.text,
            "output_ids": list(self.output_ids),
            "meta_info": self.meta_info(),
        }
        if self.prompt_ids is not None:
            out["prompt_token_ids"] = list(self.prompt_ids)
        return out

    def _triple(self, pair) -> tuple:
        """SGLang's logprob entries are (logprob, token_id, token_text or None)."""
        text = self.token_text(pair[1]) if self.token_text is not None else None
        return (pair[0], pair[1], text)


def _spec_meta(completion: int, steps: int, drafted: int, accepted: int) -> dict[str, Any]:
    """SGLang's speculative fields: tokens per decode step (accept length), drafts kept."""
    meta: dict[str, Any] = {
        "spec_verify_ct": steps,
        "spec_accept_length": completion / steps,
        "spec_num_proposed_drafts": drafted,
        "spec_num_correct_drafts": accepted,
    }
    if drafted:
        meta["spec_accept_rate"] = accepted / drafted
    return meta


def new_queues(loop: asyncio.AbstractEventLoop | None) -> tuple[queue.Queue, asyncio.Queue | None]:
    return queue.Queue(), (asyncio.Queue() if loop else None)


def raise_if_error(item):
    """An item pushed to a request: raise it if it is an exception (SchedulerDied), else pass
    it on."""
    if isinstance(item, BaseException):
        raise item
    return item


def stream_sync(
    states: list[ReqState], abort: Callable[[list[ReqState]], None]
) -> Iterator[dict[str, Any]]:
    """The chunks of `states` (sharing one thread queue) as they come, "index"ed when there
    are several; however the iteration ends, `abort(states)` ends what still runs."""
    try:
        while not all(s.finished for s in states):
            state, item = states[0].sync_q.get()
            chunk = state.stream_chunk(raise_if_error(item))
            if chunk is not None:
                yield state.indexed(chunk, len(states))
    finally:
        abort(states)


async def stream_async(
    states: list[ReqState],
    abort: Callable[[list[ReqState]], None],
) -> AsyncGenerator[dict[str, Any], None]:
    """stream_sync for async callers (the states share one asyncio queue)."""
    try:
        while not all(s.finished for s in states):
            state, item = await states[0].async_queue().get()
            chunk = state.stream_chunk(raise_if_error(item))
            if chunk is not None:
                yield state.indexed(chunk, len(states))
    finally:
        abort(states)
