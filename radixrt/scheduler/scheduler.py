"""The scheduler loop: receive → admit and schedule → forward → sample → emit → repeat.

Single-threaded; it owns every tensor. It talks to the frontend only through a Transport.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from radixrt.cache.invariants import check_kv_accounting
from radixrt.ipc.transport import Transport
from radixrt.native.memory import release_freed_memory
from radixrt.protocol.messages import (
    CLIENT_ABORT_MESSAGE,
    AbortReq,
    BatchOutput,
    FlushCacheReq,
    GenerateReq,
    GetCacheTreeReq,
    GetStatsReq,
    ReqOutput,
    SchedulerReady,
    ShutdownReq,
    decode_to_scheduler,
    encode,
)
from radixrt.scheduler import control
from radixrt.scheduler.admission import make_req
from radixrt.scheduler.beam_search import BeamSearch
from radixrt.scheduler.components import Components
from radixrt.scheduler.disaggregation import DisaggParts, create_disagg_side
from radixrt.scheduler.kv_manager import KVManager
from radixrt.scheduler.lockstep_base import Lockstep, SingleRank
from radixrt.scheduler.output import OutputProcessor, make_output
from radixrt.scheduler.planner import Planner, resolve_max_prefill_tokens
from radixrt.scheduler.policy import SchedulePolicy
from radixrt.scheduler.req import Req
from radixrt.scheduler.schedule_batch import ScheduleBatch
from radixrt.scheduler.speculation import Speculator
from radixrt.scheduler.stats import Gauges, SchedulerStats
from radixrt.scheduler.structured import Compiled, StructuredGeneration
from radixrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        args: ServerArgs,
        parts: Components,
        transport: Transport,
        lockstep: Lockstep | None = None,
    ) -> None:
        """`lockstep`: this rank's part in tensor parallelism (None: SingleRank, no
        collectives); a rank > 0's `transport` is a NullTransport."""
        self.args = args
        self.parts = parts
        self.transport = transport
        self.lockstep = lockstep if lockstep is not None else SingleRank()
        self.page_size = args.page_size
        self.stats = SchedulerStats()
        rope_switch = parts.model_config.rope.switch_length  # LongRoPE's (docs/longrope.md)
        self.kv = KVManager(
            parts.allocator,
            parts.cache,
            parts.table,
            rope_switch,
            copy_kv=parts.runner.kv_pool.copy_slots,
        )
        policy = SchedulePolicy(args.schedule_policy, self.kv, seed=args.random_seed)
        self.planner = Planner(
            self.kv,
            policy,
            resolve_max_prefill_tokens(args.max_prefill_tokens, parts.device),
            args.chunked_prefill_size,
            args.max_running_requests,
            args.schedule_conservativeness,
            self.stats,
        )
        cfg = parts.model_config
        self.structured = StructuredGeneration(
            parts.tokenizer,
            cfg.vocab_size,
            cfg.eos_token_ids,
            args.grammar_compile_timeout,
            jump_forward=not args.disable_jump_forward,
            json_any_whitespace=args.json_any_whitespace,
            stats=self.stats,
        )
        self.speculator = _speculator(args, parts, self.stats)
        self.outputs = OutputProcessor(
            cfg.eos_token_ids,
            cfg.vocab_size,
            parts.context_length,
            self.structured,
            self.stats,
            parts.tokenizer,
            parts.device,
            truncate_kv=self.kv.truncate,
            speculator=self.speculator,
        )
        self.beams = BeamSearch(self.kv, cfg.eos_token_ids, self.stats, parts.tokenizer)
        self.disagg = create_disagg_side(
            args,
            DisaggParts(
                self.kv, parts.runner.kv_pool, self.outputs, self.stats,
                self.planner.reserved_tokens, args.disaggregation_transfer_timeout,
            ),
        )  # fmt: skip
        self.running: list[Req] = []
        self.waiting: list[Req] = []
        self.arrivals = itertools.count()
        self._failed_outputs: list[Req] = []
        self.stopped = False
        self._log_mark = (time.monotonic(), 0)  # (time, decode tokens) at the last stats line
        torch.manual_seed(args.random_seed)

    # -- the loop ---------------------------------------------------------------------------
    def run_forever(self, orphaned: Callable[[], bool] | None = None) -> None:
        """Loop until a ShutdownReq arrives, or, while idle, until `orphaned()` says the
        frontend is gone."""
        stepped = False
        while not self.stopped:
            busy = self.running or self.waiting
            self._take_turn(0 if busy else self._idle_timeout(orphaned is not None))
            if self.disagg is not None:
                self._emit(self.disagg.poll(self.running, self.waiting))
            if self.running or self.waiting:
                self.step()
                stepped = True
            elif stepped:  # gone idle: hand back the heap the steps' activations freed
                release_freed_memory()  # (60 MiB after a 0.5B model's prefills; ~0.1 ms)
                stepped = False
            elif not self.structured.compiling and orphaned is not None and orphaned():
                logger.warning("the frontend process is gone: the scheduler stops")
                break
            self.parts.cache.flush_events()  # this iteration's KV events, as one batch
        self.structured.close()
        self.parts.cache.close_events()
        if self.disagg is not None:
            self.disagg.close()

    def _idle_timeout(self, watched: bool) -> float | None:
        """How long an idle loop sleeps on the socket: briefly while grammars compile or rooms
        wait for a peer; a disaggregated server looks at its peers' socket now and then; one
        whose parent is `watched` wakes each second to see it is still there."""
        if self.structured.compiling or (self.disagg is not None and self.disagg.queued):
            return 0.002
        if self.disagg is not None:
            return 0.05
        return 1.0 if watched else None

    def _take_turn(self, timeout: float | None) -> None:
        """Handle what arrived and admit compiled requests; with tensor parallelism rank 0
        relays both (and whether to stop), and the others follow it."""
        for data in self.lockstep.receive(self.transport, timeout):
            self._receive(data)
        compiled, self.stopped = self.lockstep.end_turn(self.structured, self.stopped)
        self._admit_compiled(compiled)

    def step(self) -> None:
        batch = self.planner.plan(self.running, self.waiting)
        kept_before = self.stats.kept_drafts
        now = time.time()
        for req in batch.reqs:
            if req.admitted_at is None:
                req.admitted_at = now
                self.stats.admitted(len(req.origin_input_ids), req.cached_tokens)
        if batch.reqs:
            self.stats.iteration_tokens.observe(sum(batch.extend_lens))
            started = time.perf_counter()
            if self.speculator is not None:  # its drafts are sized for the batch running now
                self.speculator.batch_size = len(self.running)
            logits = self.parts.runner.forward(batch)
            batch.commit()
            self.lockstep.sample(batch, logits, self.outputs, self.kv)
            self.beams.process(batch.logits, logits, self.running, self.waiting)
            self._record_step_cost(batch, time.perf_counter() - started)
            now = time.time()
            for req in batch.logits.sample_reqs:
                if req.first_token_at is None:
                    req.first_token_at = now
        self._settle(batch)
        self.stats.steps += 1
        self.stats.decode_tokens += batch.num_decodes + self.stats.kept_drafts - kept_before
        if self.args.enable_kv_checks:
            self.check_kv()
        self.lockstep.after_step(self)
        self._maybe_log_stats()

    def _record_step_cost(self, batch: ScheduleBatch, seconds: float) -> None:
        """Tell the speculator what a step of decodes and drafts cost, forward and sampling
        (prefills say nothing of it)."""
        if self.speculator is not None and batch.num_decodes == len(batch.reqs):
            tokens = sum(batch.extend_lens)
            self.speculator.record_step(tokens, seconds, tokens > len(batch.reqs))

    def _maybe_log_stats(self, every_s: float = 5.0) -> None:
        """One line every few seconds of activity, as SGLang and vLLM operators expect."""
        then, tokens_then = self._log_mark
        now = time.monotonic()
        if now - then < every_s or not self.lockstep.logs_stats:
            return
        decoded = self.stats.decode_tokens
        throughput = (decoded - tokens_then) / (now - then)
        self._log_mark = (now, decoded)
        pool = self.parts.pool_tokens
        used = pool - self.parts.allocator.available_tokens - self.parts.cache.evictable_size()
        logger.info(
            "running %d, queued %d, KV in use %.1f%% of %d tokens, cache hit rate "
            "%.1f%%, generation %.1f tok/s",
            len(self.running),
            len(self.waiting),
            100 * used / pool,
            pool,
            100 * self.stats.cache_hit_rate,
            throughput,
        )

    def _settle(self, batch: ScheduleBatch) -> None:
        """Release finished requests, publish prefilled chunks to the cache, emit outputs."""
        outs: list[ReqOutput] = []
        for req, prefix, n in zip(batch.reqs, batch.prefix_lens, batch.extend_lens, strict=True):
            if req.table_row < 0:  # a beam that beam search released during this step
                continue
            if req.finished and self.disagg is not None and self.disagg.hold(req):
                self.running.remove(req)  # a prefill server keeps it until its pages are sent
                continue
            if req.finished:
                # A failed request's K/V may not match its tokens: none of it is cached.
                self.kv.release(req, publish=not req.failed)
                self.running.remove(req)
                self.stats.finished(len(req.output_ids), req.cached_tokens)
            elif n > 1 and prefix < len(req.origin_input_ids):
                self.kv.cache_unfinished(req)  # a prompt chunk: a waiting sibling may want it
            if req.finished or (req.stream and req.num_emittable > req.num_sent_ids):
                outs.append(self._output_of(req))
        outs.extend(self.beams.take_outputs())
        self._emit(outs)
        self._end_failed_outputs()

    def _emit(self, outs: list[ReqOutput]) -> None:
        if outs:
            self.transport.send(encode(BatchOutput(outs)))

    def _output_of(self, req: Req) -> ReqOutput:
        """make_output(req); if that fails, the request ends (released at the next settle)
        and this output only says so."""
        try:
            return make_output(req)
        except Exception as e:  # noqa: BLE001 - one request's output must not stop the loop
            self.outputs.fail(req, f"internal error while emitting its output: {e}", e)
            self._failed_outputs.append(req)
            return ReqOutput(req.rid, [], True, req.finish_reason, len(req.origin_input_ids), 0, 0)

    def _end_failed_outputs(self) -> None:
        """Requests whose output could not be made: released now if they still run."""
        for req in self._failed_outputs:
            if req in self.running:
                self.kv.release(req, publish=False)
                self.running.remove(req)
        self._failed_outputs.clear()

    def check_kv(self) -> None:
        """The pool's count holds: free + cached + every running request's private pages."""
        holders = self.running + (self.disagg.holding() if self.disagg else [])
        held = sum(r.private_pages(self.page_size) for r in holders)
        check_kv_accounting(self.parts.allocator, self.parts.cache, held)

    # -- messages ---------------------------------------------------------------------------
    def _receive(self, data: bytes) -> None:
        try:
            msg = decode_to_scheduler(data)
        except Exception as e:  # noqa: BLE001 - a malformed message is dropped, not fatal
            logger.warning("dropped a message the scheduler cannot decode: %s", e)
            return
        self.handle(msg)

    def handle(self, msg: object) -> None:
        if isinstance(msg, GenerateReq):
            self._add_request(msg)
        elif isinstance(msg, AbortReq):
            self._abort(msg.rid)
        elif isinstance(msg, FlushCacheReq):
            self.transport.send(encode(control.flush_cache(self)))
        elif isinstance(msg, GetStatsReq):
            self.transport.send(encode(control.stats_reply(self, msg.check_kv)))
        elif isinstance(msg, GetCacheTreeReq):
            self.transport.send(encode(control.cache_tree_reply(self, msg)))
        elif isinstance(msg, ShutdownReq):
            self.stopped = True

    def ready_message(self) -> SchedulerReady:
        p = self.parts
        return SchedulerReady(
            self.args.model_path or "",
            p.model_config.vocab_size,
            p.context_length,
            p.pool_tokens,
            self.planner.max_prefill_tokens,
            list(p.model_config.eos_token_ids),
            str(p.dtype).removeprefix("torch."),
            p.device,
            p.attention_backend,
            os.getpid(),
        )

    def get_stats(self) -> dict[str, Any]:
        p = self.parts
        now = Gauges(
            grammar_queue=len(self.structured.compiling),
            running=len(self.running),
            queued=len(self.waiting),
            pool_tokens=p.pool_tokens,
            free_tokens=p.allocator.available_tokens,
            evictable_tokens=p.cache.evictable_size(),
            protected_tokens=p.cache.protected_size(),
            beam_groups=self.beams.groups(self.running),
            disagg_queue=self.disagg.queued if self.disagg else 0,
        )
        return self.stats.to_dict(now, p.cache.block_timings)

    def _add_request(self, msg: GenerateReq) -> None:
        try:
            req = make_req(msg, self.args, self.parts, self.arrivals)
        except ValueError as e:  # a bad request: the frontend's checks, made again here
            self._refuse(msg, str(e))
            return
        except Exception as e:  # noqa: BLE001 - whatever it was, it ends this request only
            logger.warning("request %s refused: %s", msg.rid, e, exc_info=True)
            self._refuse(msg, f"the request is invalid: {e}")
            return
        if (req.sampling_params.beam_width or 1) > 1:
            self.beams.adopt(req, msg.beam_rids)
        queued = False  # by its side of prefill/decode disaggregation (make_req checked one runs)
        if msg.bootstrap is not None and self.disagg is not None:
            try:
                queued = self.disagg.adopt(req, msg.bootstrap)
            except ValueError as e:  # its room (or rid) is in use here
                self._refuse(msg, str(e))
                return
        self.stats.accepted(len(req.origin_input_ids))
        if not self.lockstep.submit(req, self.structured) and not queued:
            self.waiting.append(req)

    def _refuse(self, msg: GenerateReq, message: str) -> None:
        """End a request that could not be made (each of a beam search's results)."""
        for rid in msg.beam_rids or [msg.rid]:
            self._send_abort(rid, len(msg.input_ids), message)

    def _admit_compiled(self, compiled: Compiled) -> None:
        """Requests whose grammar has compiled join the waiting queue; those whose constraint
        did not compile in time, or admits no token, end here (the frontend refuses both;
        other frontends may not)."""
        self.waiting.extend(r for r in compiled.ready if not (self.disagg and self.disagg.ready(r)))
        for req, message in compiled.failed:
            self._send_abort(req.rid, len(req.origin_input_ids), message)

    def _abort(self, rid: str) -> None:
        if self.disagg is not None:
            self._emit(self.disagg.abort(rid))
        for held in self.lockstep.cancel(rid, self.structured):
            self._send_abort(rid, len(held.origin_input_ids), CLIENT_ABORT_MESSAGE)
        for queue_ in (self.waiting, self.running):
            for req in [r for r in queue_ if r.rid == rid or self.beams.names(r, rid)]:
                if req.beam is not None:  # the whole group, each of its results aborted
                    for out_rid in self.beams.abort(req, queue_, self.running):
                        self._send_abort(out_rid, len(req.origin_input_ids), CLIENT_ABORT_MESSAGE)
                    break
                if queue_ is self.running:
                    self.kv.release(req)
                queue_.remove(req)
                req.finish_reason = {"type": "abort", "message": CLIENT_ABORT_MESSAGE}
                self.transport.send(encode(BatchOutput([make_output(req)])))

    def _send_abort(self, rid: str, prompt_tokens: int, message: str) -> None:
        out = ReqOutput(rid, [], True, {"type": "abort", "message": message}, prompt_tokens, 0, 0)
        self.transport.send(encode(BatchOutput([out])))


def _speculator(args: ServerArgs, parts: Components, stats: SchedulerStats) -> Speculator | None:
    if args.speculative_algorithm is None:
        return None
    return Speculator(
        parts.cache,
        args.speculative_num_draft_tokens,
        args.speculative_ngram_min_match_window_size,
        args.speculative_ngram_max_match_window_size,
        parts.context_length,
        stats,
        rope_switch=parts.model_config.rope.switch_length,
    )
