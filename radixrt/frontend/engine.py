"""The offline engine: `radixrt.Engine().generate(...)`, SGLang's offline API.

The engine tokenizes and validates in the caller's process; the scheduler loop owns the model in
a child process behind a Transport, its outputs reaching the engine through the detokenizer
process (their text); in-process (tests, notebooks) both run on threads behind the same one."""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from radixrt.errors import SchedulerDied, ServerOverloaded
from radixrt.frontend.beam_api import beam_search
from radixrt.frontend.engine_start import start_backend
from radixrt.frontend.request_registry import RequestRegistry
from radixrt.frontend.request_state import (
    ReqState,
    new_queues,
    raise_if_error,
    stream_async,
    stream_sync,
)
from radixrt.observability.log_setup import configure_default_logging
from radixrt.protocol.messages import (
    AbortReq,
    BatchOutput,
    ControlReply,
    FlushCacheReq,
    GetCacheTreeReq,
    GetStatsReq,
    SchedulerFailed,
    ShutdownReq,
    decode_from_scheduler,
    encode,
)
from radixrt.protocol.request_input import GenerateReqInput, engine_call_request
from radixrt.server_args import ServerArgs

if TYPE_CHECKING:
    from radixrt.frontend.validation import PlannedReq

logger = logging.getLogger("radixrt.engine")  # the name operators filter on, kept across moves


_LIVE_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
_DEATH_POLL_S = 0.1  # how soon the dispatcher notices a dead child process
_SEND_POLL_S = 0.5  # how often a send that cannot go out checks that the scheduler lives


@atexit.register
def _shutdown_live_engines() -> None:
    """Stop schedulers still running at exit (a weak set: engines stay collectable)."""
    for engine in list(_LIVE_ENGINES):
        engine.shutdown()


class Engine:
    """`Engine(model_path=None, **server_args)`: every ServerArgs field is a keyword argument.

    The scheduler and the detokenizer run in child processes (ZeroMQ between them) unless
    `in_process=True`, which runs both on threads of this process, behind in-process queues
    laid out the same way (handy in tests and notebooks; slower on the CPU when this process
    also runs torch)."""

    def __init__(
        self, model_path: str | None = None, *, in_process: bool = False, **kwargs: Any
    ) -> None:
        self.server_args = args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        configure_default_logging("frontend", args.log_level)
        self._handle, self.tokenizer = start_backend(args, in_process)
        self._requests = RequestRegistry()
        self._send_lock = threading.Lock()  # sockets are not thread-safe
        self._control_lock = threading.Lock()  # one control request at a time
        self._control_replies: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._refusal: SchedulerDied | None = None  # set once new requests are refused
        self._closed = False
        self._token_texts: dict[int, str] = {}  # return_text_in_logprobs: id -> its text
        # Hooks for the server: observer(state, output) sees every output (metrics), on_death
        # (error) runs once if the scheduler side dies. Both run on the dispatcher thread.
        self.observer: Callable[[ReqState, Any], None] | None = None
        self.on_death: Callable[[SchedulerDied], None] | None = None
        self.info = self._handle.info
        self._dispatch_thread = threading.Thread(
            target=self._dispatch, daemon=True, name="radixrt-dispatch"
        )
        self._dispatch_thread.start()
        _LIVE_ENGINES.add(self)

    @property
    def error(self) -> BaseException | None:
        """Why the engine stopped working (its scheduler side died), or None."""
        return self._error

    @property
    def scheduler(self):
        """The Scheduler object, when it runs in this process (in_process=True); else None."""
        return self._handle.local_scheduler

    # -- public API -------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        **fields: Any,
    ) -> Any:
        """SGLang's Engine.generate. `fields` are the other fields of GenerateReqInput
        (radixrt/protocol/request_input.py: return_logprob, logprob_start_len, top_logprobs_num,
        token_ids_logprob, return_text_in_logprobs, rid, stream, bootstrap_host/_port/_room,
        ...; an unsupported one raises ValueError unless it carries its null/default value).

        One prompt → one dict (a list of n when n > 1); a list of prompts → a list of dicts
        in order. With stream=True, an iterator of chunks whose "text" is the new text (with
        several requests, chunks interleave and carry the "index" of their output)."""
        req = engine_call_request(prompt, sampling_params, input_ids, fields)
        return self.generate_request(req)

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        **fields: Any,
    ) -> Any:
        """The async twin of generate; with stream=True returns an async iterator of chunks."""
        return await self.async_generate_request(
            engine_call_request(prompt, sampling_params, input_ids, fields)
        )

    beam_search = beam_search  # vLLM's LLM.beam_search (frontend/beam_api.py)

    def generate_request(self, req: GenerateReqInput) -> Any:
        """generate, given the request struct itself."""
        states, batch = self._submit(req, loop=None)
        if req.stream:
            return stream_sync(states, self._abort_unfinished)
        results = [s.wait() for s in states]
        return results if batch or len(results) > 1 else results[0]

    async def async_generate_request(self, req: GenerateReqInput) -> Any:
        """async_generate, given the request struct itself. Tokenizing and validating run on a
        worker thread: a long prompt must not hold up the caller's event loop (an HTTP
        server's other requests and its /health)."""
        loop = asyncio.get_running_loop()
        submitted = loop.run_in_executor(None, self._submit, req, loop)
        try:
            states, batch = await asyncio.shield(submitted)
        except asyncio.CancelledError:  # gone before its requests were sent: end them then
            submitted.add_done_callback(self._abort_submitted)
            raise
        if req.stream:
            return stream_async(states, self._abort_unfinished)
        try:
            results = [await s.wait_async() for s in states]
        except asyncio.CancelledError:  # the caller gave up (an HTTP client went away)
            self._abort_unfinished(states)
            raise
        return results if batch or len(results) > 1 else results[0]

    def _abort_submitted(self, submitted: asyncio.Future) -> None:
        if not submitted.cancelled() and submitted.exception() is None:
            self._abort_unfinished(submitted.result()[0])

    def flush_cache(self) -> bool:
        """Empty the radix cache; refused (False) while requests run. Every call to the engine
        raises SchedulerDied, naming the process, once a child process has died."""
        return self._control(FlushCacheReq()).success

    def get_stats(self, check_kv: bool = False) -> dict[str, Any]:
        """The scheduler's counters (tokens, steps, preemptions, KV pool usage). With check_kv,
        the KV accounting check runs too and a failure raises AssertionError."""
        reply = self._control(GetStatsReq(check_kv))
        if not reply.success or reply.stats is None:
            raise AssertionError(reply.message)
        return reply.stats

    def get_cache_tree(self, depth: int = 6, max_nodes: int = 200) -> dict[str, Any]:
        """A bounded snapshot of the radix tree, the KV pool and the queues (docs/dashboard.md)."""
        tree = self._control(GetCacheTreeReq(depth, max_nodes)).cache_tree
        assert tree is not None, "the scheduler answers get_cache_tree with its snapshot"
        return tree

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """SGLang's abort_request: the request with exactly this rid, or the requests made
        from it (its n samples, a batch given one rid); with abort_all, every request. An
        unknown rid is ignored (it may have just finished)."""
        self._check_running()
        for r in self._requests.abort_targets(rid, abort_all):
            self._send(AbortReq(r))

    def get_server_info(self) -> dict[str, Any]:
        info = self.info
        return {
            "model_path": info.model_path,
            "dtype": info.dtype,
            "device": info.device,
            "attention_backend": info.attention_backend,
            "scheduler_pid": info.pid,
            "max_total_num_tokens": info.pool_tokens,
            "max_prefill_tokens": info.max_prefill_tokens,
            "context_length": info.context_length,
            **self.get_stats(),
        }

    # -- stopping ---------------------------------------------------------------------------
    def refuse_new_requests(self, error: SchedulerDied) -> None:
        """Stop taking work (a server's SIGTERM): every later request raises `error` (a
        ServerShuttingDown: HTTP 503); running requests go on."""
        self._refusal = error

    @property
    def num_requests(self) -> int:
        """Requests registered and not yet finished (running, queued or being submitted)."""
        return len(self._requests)

    def end_all_requests(self, error: SchedulerDied) -> int:
        """End every request now: each caller gets `error` (a stream as its last item), and
        the scheduler is told to drop them; later requests are refused (with `error` unless
        refuse_new_requests came first). Returns how many there were."""
        self._refusal = self._refusal or error
        states = self._requests.pop_all()
        for state in states:
            state.push(error)
        for state in states if self._error is None else ():
            self._send(AbortReq(state.rid), quiet=True)
        return len(states)

    def shutdown(self, timeout: float = 30) -> None:
        """Stop the scheduler and detokenizer (killed if the scheduler takes over `timeout`
        seconds, at once if a child has died). Requests still running fail with SchedulerDied.
        Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.end_all_requests(SchedulerDied("the engine was shut down"))
        # Also when a child has died: the scheduler may be the one still running (and if it is
        # the dead one, the send must not wait for it).
        with self._send_lock:
            self._handle.transport.send(encode(ShutdownReq()), block=False)
        self._handle.stop(timeout=timeout)
        self._control_replies.put(SchedulerDied("the engine was shut down"))  # a waiter
        self._dispatch_thread.join(timeout=5)
        self._handle.close()
        if self._handle.local_scheduler is not None:  # it holds the weights and the KV pool:
            self._handle.local_scheduler = None  # let them go now, not at the next collection
            gc.collect()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- submission -------------------------------------------------------------------------
    def _submit(self, req: GenerateReqInput, loop) -> tuple[list[ReqState], bool]:
        self._check_running(new_work=True)
        from radixrt.frontend.validation import build_requests

        reqs, is_batch = build_requests(self, req)
        self._check_queue(len(reqs))
        shared = new_queues(loop) if req.stream else None  # one iterator streams them all
        states = [self._new_state(planned, loop, i, shared) for i, planned in enumerate(reqs)]
        batch_rid = {req.rid} if isinstance(req.rid, str) else set()
        self._requests.add(
            [
                (state, {planned.parent_rid} | batch_rid)
                for state, planned in zip(states, reqs, strict=True)
            ]
        )
        stopped = self._error or self._refusal  # while these were being registered
        if stopped is not None:
            self._requests.remove(states)
            raise stopped
        for planned in reqs:
            if planned.send:
                self._send(planned.msg)
        return states, is_batch

    def _check_running(self, new_work: bool = False) -> None:
        """SchedulerDied (its message names the dead process) once the engine has stopped;
        with new_work, ServerShuttingDown once new requests are refused."""
        if self._error is not None:
            raise SchedulerDied(str(self._error))
        if new_work and self._refusal is not None:  # also once closed: a server stopping
            raise self._refusal
        if self._closed:
            raise SchedulerDied("the engine was shut down")

    def _check_queue(self, count: int) -> None:
        """503 territory: refuse work beyond max_running_requests + max_queued_requests."""
        args = self.server_args
        if args.max_queued_requests is None:
            return
        limit = args.max_running_requests + args.max_queued_requests
        outstanding = len(self._requests)
        if outstanding + count > limit:
            raise ServerOverloaded(
                f"the server is at capacity ({outstanding} requests running or queued; "
                f"max_running_requests + max_queued_requests = {limit}): retry later"
            )

    def _new_state(self, planned: PlannedReq, loop, index: int, queues) -> ReqState:
        msg, params = planned.msg, planned.params
        wants_text = planned.return_text_in_logprobs and self.tokenizer is not None
        token_text = self._token_text if wants_text else None
        return ReqState(
            msg.rid,
            msg.return_logprob,
            loop,
            index,
            queues,
            token_text=token_text,
            log_metrics=planned.log_metrics,
            stream_interval=params.stream_interval or 1,
            ids_logprob=msg.token_ids_logprob is not None,
            prompt_ids=msg.input_ids if planned.return_prompt_token_ids else None,
        )

    def _token_text(self, token_id: int) -> str:
        """A token's text as SGLang reports it in logprobs: the id decoded alone."""
        text = self._token_texts.get(token_id)
        if text is None:
            assert self.tokenizer is not None, "token_text is given out only with a tokenizer"
            # One flat id list decodes to one str (the annotation's list[str] is for batches).
            text = self._token_texts[token_id] = cast(str, self.tokenizer.decode([token_id]))
        return text

    # -- plumbing ---------------------------------------------------------------------------
    def _send(self, msg, quiet: bool = False) -> None:
        """Send to the scheduler, or raise SchedulerDied once it is gone (a ZeroMQ send to a
        dead peer would wait forever); `quiet`: return instead (nothing left to tell)."""
        data = encode(msg)
        with self._send_lock:
            while not self._handle.transport.send(data, timeout=_SEND_POLL_S):
                if self._error is not None or not self._handle.alive():
                    if quiet:
                        return
                    raise SchedulerDied(str(self._error or self._death()))

    def _abort_unfinished(self, states: list[ReqState]) -> None:
        """The caller left early (a dropped stream, a cancelled wait): end its requests and
        give back their KV. Silent once the engine has stopped: they are gone anyway."""
        for state in states:
            if self._error is None and self._requests.get(state.rid) is not None:
                self._send(AbortReq(state.rid), quiet=True)

    def _control(self, msg) -> ControlReply:
        with self._control_lock:
            self._check_running()
            self._send(msg)
            reply = self._control_replies.get()
        return raise_if_error(reply)

    def _death(self) -> SchedulerDied:
        return SchedulerDied(f"a server process died: {self._handle.death_reason()}")

    def _dispatch(self) -> None:
        """Route the scheduler's messages to the requests waiting for them; notice its death."""
        transport = self._handle.transport
        while not (self._closed and not self._handle.alive()):
            items = transport.recv(timeout=_DEATH_POLL_S)
            if not items and not self._handle.alive():
                if not self._closed:
                    self._fail_all(self._death())
                return
            for item in items:
                self._route(decode_from_scheduler(item))

    def _route(self, msg) -> None:
        if isinstance(msg, ControlReply):
            self._control_replies.put(msg)
        elif isinstance(msg, SchedulerFailed):  # a rank's death may be its cause: name it
            dead = "" if self._handle.alive() else f"; {self._handle.death_reason()}"
            self._fail_all(
                SchedulerDied(f"the scheduler has died: {msg.error_type}: {msg.error}{dead}")
            )
        elif isinstance(msg, BatchOutput):
            for out in msg.outputs:
                state = self._requests.get(out.rid, finished=out.finished)
                if state is not None:
                    if self.observer is not None and state.log_metrics:
                        self.observer(state, out)
                    state.push(out)

    def _fail_all(self, error: SchedulerDied) -> None:
        logger.error("%s", error)
        first = self._error is None
        self._error = error
        self.end_all_requests(error)
        self._control_replies.put(error)
        if first and self.on_death is not None:
            self.on_death(error)
