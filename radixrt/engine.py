"""The offline engine: `radixrt.Engine().generate(...)`, SGLang's offline API.

The engine tokenizes, validates and detokenizes in the caller's process; the scheduler loop (the
same one the server runs) owns the model and runs on its own thread behind a Transport.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from radixrt.detokenizer import IncrementalDetokenizer
from radixrt.messages import (
    AbortReq,
    BatchOutput,
    ControlReply,
    FlushCacheReq,
    GenerateReq,
    ShutdownReq,
    decode_from_scheduler,
    encode,
)
from radixrt.request_state import ReqState, SchedulerDied
from radixrt.sampling_params import SamplingParams
from radixrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Engine:
    """`Engine(model_path=None, **server_args)`: every ServerArgs field is a keyword argument."""

    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        from radixrt.loader.default_model import default_model_path
        from radixrt.loader.tokenizer import load_tokenizer
        from radixrt.scheduler.components import build_components
        from radixrt.scheduler.scheduler import Scheduler
        from radixrt.scheduler.transport import queue_pair

        self.server_args = args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        logging.basicConfig(level=args.log_level.upper())
        path = args.model_path or default_model_path()
        self.tokenizer = None
        if not args.skip_tokenizer_init:
            self.tokenizer = load_tokenizer(path, args.tokenizer_path)
        self.parts = build_components(args, self.tokenizer)
        self._front, self._back = queue_pair()
        self.scheduler = Scheduler(args, self.parts, self._back)
        self._states: dict[str, ReqState] = {}
        self._lock = threading.Lock()
        self._control_replies: list[ControlReply] = []
        self._control_event = threading.Event()
        self._error: BaseException | None = None
        self._sched_thread = threading.Thread(target=self._run_scheduler, daemon=True,
                                              name="radixrt-scheduler")
        self._dispatch_thread = threading.Thread(target=self._dispatch, daemon=True,
                                                 name="radixrt-dispatch")
        self._sched_thread.start()
        self._dispatch_thread.start()

    # -- public API -------------------------------------------------------------------------
    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None,
                 return_logprob: bool = False, logprob_start_len: int | None = None,
                 top_logprobs_num: int | None = None, rid: str | list[str] | None = None,
                 stream: bool = False) -> Any:
        """One prompt → one dict (a list of n when n > 1); a list of prompts → a list of dicts
        in order. With stream=True, an iterator of chunks whose "text" is the new text."""
        states, batch = self._submit(prompt, sampling_params, input_ids, return_logprob,
                                     logprob_start_len, top_logprobs_num, rid, stream, loop=None)
        if stream:
            return self._stream_sync(states[0])
        results = [self._wait_sync(s) for s in states]
        return results if batch or len(results) > 1 else results[0]

    async def async_generate(self, prompt: str | list[str] | None = None,
                             sampling_params: dict | list[dict] | None = None,
                             input_ids: list[int] | list[list[int]] | None = None,
                             return_logprob: bool = False, logprob_start_len: int | None = None,
                             top_logprobs_num: int | None = None,
                             rid: str | list[str] | None = None, stream: bool = False) -> Any:
        """The async twin of generate; with stream=True returns an async iterator of chunks."""
        states, batch = self._submit(prompt, sampling_params, input_ids, return_logprob,
                                     logprob_start_len, top_logprobs_num, rid, stream,
                                     loop=asyncio.get_running_loop())
        if stream:
            return self._stream_async(states[0])
        results = [await self._wait_async(s) for s in states]
        return results if batch or len(results) > 1 else results[0]

    def flush_cache(self) -> bool:
        """Empty the radix cache; refused (False) while requests run."""
        self._control_event.clear()
        self._front.send(encode(FlushCacheReq()))
        self._control_event.wait()
        return self._control_replies.pop().success

    def abort_request(self, rid: str) -> None:
        with self._lock:
            rids = [r for r in self._states if r == rid or r.startswith(rid + "-")]
        for r in rids:
            self._front.send(encode(AbortReq(r)))

    def get_server_info(self) -> dict[str, Any]:
        parts, stats = self.parts, self.scheduler.stats
        return {"model_path": self.server_args.model_path, "dtype": str(parts.dtype),
                "device": parts.device, "attention_backend": parts.attention_backend,
                "max_total_num_tokens": parts.pool_tokens, "context_length":
                parts.context_length, "cache_hit_rate": self.scheduler.cache_hit_rate, **stats}

    def shutdown(self) -> None:
        if self._sched_thread.is_alive():
            self._front.send(encode(ShutdownReq()))
            self._sched_thread.join(timeout=30)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- submission -------------------------------------------------------------------------
    def _submit(self, prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                top_logprobs_num, rid, stream, loop) -> tuple[list[ReqState], bool]:
        if self._error is not None:
            raise SchedulerDied(f"the scheduler has died: {self._error!r}")
        from radixrt.frontend_validation import build_requests

        reqs, is_batch = build_requests(
            self, prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, rid, stream)
        if stream and len(reqs) != 1:
            raise ValueError("stream=True takes one prompt with n=1")
        states = []
        for msg, params in reqs:
            states.append(self._register(msg, params, loop))
        for msg, _ in reqs:
            self._front.send(encode(msg))
        return states, is_batch

    def _register(self, msg: GenerateReq, params: SamplingParams, loop) -> ReqState:
        detok = None
        if self.tokenizer is not None:
            detok = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens,
                                           params.spaces_between_special_tokens, params.stop,
                                           params.no_stop_trim)
        state = ReqState(msg.rid, detok, msg.return_logprob, loop)
        with self._lock:
            if msg.rid in self._states:
                raise ValueError(f"rid {msg.rid!r} is already in use by a running request")
            self._states[msg.rid] = state
        return state

    def new_rid(self) -> str:
        return uuid.uuid4().hex

    # -- waiting for results ----------------------------------------------------------------
    def _wait_sync(self, state: ReqState) -> dict[str, Any]:
        while not state.finished:
            state.absorb(_raise_if_error(state.sync_q.get()))
        return state.result()

    def _stream_sync(self, state: ReqState) -> Iterator[dict[str, Any]]:
        try:
            while not state.finished:
                yield state.absorb(_raise_if_error(state.sync_q.get()))
        finally:
            if not state.finished:
                self.abort_request(state.rid)

    async def _wait_async(self, state: ReqState) -> dict[str, Any]:
        while not state.finished:
            state.absorb(_raise_if_error(await state.async_q.get()))
        return state.result()

    async def _stream_async(self, state: ReqState) -> AsyncIterator[dict[str, Any]]:
        try:
            while not state.finished:
                yield state.absorb(_raise_if_error(await state.async_q.get()))
        finally:
            if not state.finished:
                self.abort_request(state.rid)

    # -- threads ----------------------------------------------------------------------------
    def _run_scheduler(self) -> None:
        try:
            self.scheduler.run_forever()
        except BaseException as e:  # surface it to every waiting caller instead of hanging
            logger.exception("scheduler loop failed")
            self._error = e
            with self._lock:
                states = list(self._states.values())
            for s in states:
                s.push(SchedulerDied(f"the scheduler has died: {e!r}"))
        finally:
            self._back.outbox.put(None)  # wakes the dispatcher so it can exit

    def _dispatch(self) -> None:
        while True:
            item = self._front.inbox.get()
            if item is None:
                return
            msg = decode_from_scheduler(item)
            if isinstance(msg, ControlReply):
                self._control_replies.append(msg)
                self._control_event.set()
                continue
            assert isinstance(msg, BatchOutput)
            for out in msg.outputs:
                with self._lock:
                    state = self._states.get(out.rid)
                    if out.finished:
                        self._states.pop(out.rid, None)
                if state is not None:
                    state.push(out)


def _raise_if_error(item):
    if isinstance(item, BaseException):
        raise item
    return item
