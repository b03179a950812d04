"""The decode server's side of disaggregation: admit a request by matching its prompt in this
server's radix cache, ask the prefill server for the rest of its K/V, store what comes, and
let the request decode from there.

Admission takes a table row and pages for the whole prompt (the matched prefix locked, as
any admission), within --max-running-requests and the KV the running decodes have reserved.
A request whose identical prompt is being received by another waits for it, so that its
prefix comes out of the cache and is sent once (n > 1). The pull goes out with how many
leading positions are held here; the answer brings the rest and the first output token,
which is taken as if this server had sampled it (stops, grammar, logprobs). A failed or timed
out transfer is recomputed here (--disaggregation-failure-policy recompute: the request joins
the waiting queue as an ordinary one) or fails the request (fail); either way its pages
are freed at once and a cancel tells the prefill server to free its own.

Only a prefill server of --disaggregation-bootstrap-peers is asked, and only its answers with
the bootstrap key's tag are read: an answer signed otherwise fails its room (by the policy)
before a byte of it reaches the pool (docs/disaggregation.md, "Trust model").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import zmq

from radixrt.disaggregation.endpoints import Answer, DecodeEndpoint
from radixrt.disaggregation.messages import (
    KVCancel,
    KVPages,
    KVPoll,
    KVPull,
    KVWait,
    prompt_digest,
)
from radixrt.disaggregation.pages import layout_of, write_slots
from radixrt.grammar.constraint import constraint_of
from radixrt.protocol.messages import Bootstrap, ReqOutput
from radixrt.scheduler.disaggregation import DisaggParts, DisaggSide
from radixrt.scheduler.output import make_output
from radixrt.scheduler.req import Req

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    req: Req
    bootstrap: Bootstrap
    peer: str  # the prefill server's tcp:// address, from the allowed list
    compiled: bool  # its grammar (if any) is ready
    state: KVPoll = KVPoll.Bootstrapping
    asked_at: float = 0.0  # when the pull went out, or the prefill server last spoke


class DecodeSide(DisaggSide):
    mode = "decode"

    def __init__(
        self, parts: DisaggParts, endpoint: DecodeEndpoint, recompute: bool, max_running: int
    ) -> None:
        """`recompute`: --disaggregation-failure-policy recompute (else fail);
        `max_running`: --max-running-requests."""
        super().__init__(parts)
        self.endpoint = endpoint
        self.layout = layout_of(parts.pool)
        self.recompute = recompute
        self.max_running = max_running
        self.pending: dict[int, _Pending] = {}  # by room, in arrival order

    def adopt(self, req: Req, bootstrap: Bootstrap) -> bool:
        if bootstrap.room in self.pending:
            raise ValueError(f"bootstrap_room {bootstrap.room} is already in use here")
        # A peer not in --disaggregation-bootstrap-peers is refused here, before any socket
        # (the frontend refused it already; another frontend may not).
        peer = self.endpoint.address(bootstrap.host, bootstrap.port)
        # The prefill server computes the prompt logprobs (SMG puts its list first).
        req.input_token_logprobs.clear()
        req.input_top_logprobs.clear()
        req.input_token_ids_logprobs.clear()
        req.input_logprobs_count = len(req.origin_input_ids)
        compiled = constraint_of(req.sampling_params) is None  # else: ready() says when
        self.pending[bootstrap.room] = _Pending(req, bootstrap, peer, compiled)
        return True

    def ready(self, req: Req) -> bool:
        for entry in self.pending.values():
            if entry.req is req:
                entry.compiled = True
                return True
        return False

    def holding(self) -> list[Req]:
        return [p.req for p in self.pending.values() if p.req.table_row >= 0]

    @property
    def queued(self) -> int:
        return len(self.pending)

    def poll(self, running: list[Req], waiting: list[Req]) -> list[ReqOutput]:
        outs: list[ReqOutput] = []
        for answer in self.endpoint.receive():
            out = self._answered(answer, running, waiting)
            if out is not None:
                outs.append(out)
        self.endpoint.close_idle()
        if not self.pending:  # the step loop's usual case: nothing to time out or admit
            return outs
        now = time.monotonic()
        for room, entry in list(self.pending.items()):
            if entry.state == KVPoll.WaitingForInput and now - entry.asked_at > self.timeout:
                reason = f"no word from the prefill server on room {room} for {self.timeout:g} s"
                # Its socket may have been closed as idle: a silent peer is worth no new one.
                self.endpoint.send(entry.peer, KVCancel(room), open_new=False)
                out = self._fail(room, entry, reason, waiting)
                if out is not None:
                    outs.append(out)
        for room, entry in self._admit(running):
            reason = f"{self.endpoint.max_peers} prefill servers are open already"
            out = self._fail(room, entry, reason, waiting)
            if out is not None:
                outs.append(out)
        return outs

    def abort(self, rid: str) -> list[ReqOutput]:
        for room, entry in list(self.pending.items()):
            if entry.req.rid == rid:
                del self.pending[room]
                self.endpoint.send(entry.peer, KVCancel(room))  # frees the prefill's pages now
                if entry.req.table_row >= 0:
                    self.kv.release(entry.req, publish=False)
                entry.req.finish_reason = {"type": "abort", "message": "aborted by the client"}
                return [make_output(entry.req)]
        return []

    def close(self) -> None:
        self.endpoint.close()

    # -- admission --------------------------------------------------------------------------
    def _admit(self, running: list[Req]) -> list[tuple[int, _Pending]]:
        """Admit waiting rooms in arrival order while rows and KV last; each asks for its
        pages at once. Returns the rooms whose peer cannot get a socket (the cap)."""
        admissible = [
            (room, entry)
            for room, entry in self.pending.items()
            if entry.state == KVPoll.Bootstrapping and entry.compiled
        ]
        unreachable: list[tuple[int, _Pending]] = []
        if not admissible:
            return unreachable
        receiving = [
            p.req.origin_input_ids for p in self.pending.values() if p.state != KVPoll.Bootstrapping
        ]
        reserved = self.parts.reserved_tokens(running + self.holding())
        for room, entry in admissible:
            req = entry.req
            if len(running) + len(receiving) >= self.max_running:
                break
            if not self.endpoint.can_reach(entry.peer):
                unreachable.append((room, entry))
                continue
            if self.kv.caches(req) and req.origin_input_ids in receiving:
                continue  # the same prompt is on its way: take it from the cache next
            match = self.kv.match(req)
            need = len(req.origin_input_ids) - req.prefix_match_len
            own = self.parts.reserved_tokens([req])
            short = self.kv.available_tokens() < need + reserved + own + self.kv.page_size
            if (short and (running or receiving)) or not self.kv.fits(req, match, need):
                break
            self.kv.admit(req, match, need)
            req.admitted_at = time.time()
            self.stats.admitted(len(req.origin_input_ids), req.cached_tokens)
            self.stats.disagg_reused_tokens += req.kv_len
            digest = prompt_digest(req.origin_input_ids)
            pull = KVPull(room, len(req.origin_input_ids), req.kv_len, digest, self.layout)
            self.endpoint.send(entry.peer, pull)
            entry.state, entry.asked_at = KVPoll.WaitingForInput, time.monotonic()
            receiving.append(req.origin_input_ids)
            reserved += own
        return unreachable

    # -- arrival ----------------------------------------------------------------------------
    def _answered(self, answer: Answer, running: list[Req], waiting: list[Req]) -> ReqOutput | None:
        """One answer from a prefill server: only the peer a room asked may answer it, and
        only with its tag verified; a wrongly signed answer fails the room (its frames were
        never read into the pool)."""
        header = answer.header
        entry = self.pending.get(header.room)
        if entry is None or entry.state != KVPoll.WaitingForInput or entry.peer != answer.peer:
            return None  # a room given up meanwhile, or not this peer's
        if not answer.authentic:
            reason = (
                f"{answer.peer} answered room {header.room} without this server's bootstrap key "
                "(--disaggregation-bootstrap-key differs between the two servers)"
            )
            return self._fail(header.room, entry, reason, waiting)
        if isinstance(header, KVWait):  # the prefill server is alive and on it
            entry.asked_at = time.monotonic()
            return None
        return self._receive(header, answer.frames, entry, running, waiting)

    def _receive(
        self,
        header: KVPages,
        frames: list[zmq.Frame],
        entry: _Pending,
        running: list[Req],
        waiting: list[Req],
    ) -> ReqOutput | None:
        """Store the pages and take the first token; the request decodes from the next step."""
        req, room = entry.req, header.room
        if not header.ok:
            return self._fail(room, entry, f"the prefill server refused: {header.reason}", waiting)
        started = time.perf_counter()
        prompt_len = len(req.origin_input_ids)
        try:
            if header.count != prompt_len - req.kv_len:
                raise ValueError(f"{header.count} positions sent, {prompt_len - req.kv_len} asked")
            slots = self.kv.slots(req, req.kv_len, prompt_len)
            nbytes = write_slots(self.parts.pool, slots, [f.buffer for f in frames])
        except ValueError as e:
            return self._fail(room, entry, f"the pages of room {room} do not fit: {e}", waiting)
        del self.pending[room]
        self.count_transfer(header.count, nbytes, started)
        req.kv_len = prompt_len
        self.kv.cache_unfinished(req)  # a waiting request with the same prompt hits it next
        req.first_token_at = time.time()
        top = header.top_logprobs or []
        logprob = None if header.logprob is None else (header.logprob, top, header.ids_logprobs)
        self.parts.outputs.take_transferred(req, header.first_token, logprob)
        if req.finished:  # the first token ended it (a stop, or max_new_tokens 1)
            self.kv.release(req)
            self.stats.finished(len(req.output_ids), req.cached_tokens)
            return make_output(req)
        running.append(req)
        return make_output(req) if req.stream else None

    def _fail(
        self, room: int, entry: _Pending, reason: str, waiting: list[Req]
    ) -> ReqOutput | None:
        """Recompute the request here (it joins the waiting queue) or fail it; its pages go
        back either way (none of them holds computed K/V)."""
        logger.warning("room %d (request %s): %s", room, entry.req.rid, reason)
        self.stats.disagg_transfer_failures += 1
        del self.pending[room]
        req = entry.req
        if req.table_row >= 0:
            self.kv.release(req, publish=False)
        if self.recompute:
            waiting.append(req)
            return None
        req.fail(reason)
        return make_output(req)
