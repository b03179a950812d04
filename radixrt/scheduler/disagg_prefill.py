"""The prefill server's side of disaggregation: run the prompt, keep its K/V until the decode
server asks for it, send it with the first token, then release the request.

A request with a room is prefilled as any other (radix cache, chunks), with max_new_tokens
forced to 1 as SGLang's prefill server does. When it finishes it is held, pages locked, until
a pull for its room arrives; the pull says how many leading positions the decode server
already holds (its own radix cache), and only the rest is sent. Then the request is released
(its prompt stays in this server's cache) and its output goes back to the client: the HTTP
response of a prefill server ends when its pages are on their way. A room whose pull does not
come within the transfer timeout, a pull that does not match the prompt, a peer that is gone,
or a cancel from the decode server, ends the request with an abort and frees its pages.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from radixrt.disaggregation.endpoints import PrefillEndpoint
from radixrt.disaggregation.messages import (
    KVCancel,
    KVPages,
    KVPull,
    KVWait,
    prompt_digest,
)
from radixrt.disaggregation.pages import layout_of, read_slots
from radixrt.protocol.messages import Bootstrap, ReqOutput
from radixrt.scheduler.disaggregation import DisaggParts, DisaggSide
from radixrt.scheduler.output import make_output
from radixrt.scheduler.req import Req

logger = logging.getLogger(__name__)


@dataclass
class _Room:
    req: Req
    held_since: float = 0.0  # when its prefill finished (monotonic)
    pull: tuple[bytes, KVPull] | None = None
    cancelled: bool = False  # the decode server gave it up while it was prefilling
    told_at: float = 0.0  # when the decode server last heard of it (a KVWait; monotonic)


class PrefillSide(DisaggSide):
    mode = "prefill"

    def __init__(self, parts: DisaggParts, endpoint: PrefillEndpoint) -> None:
        super().__init__(parts)
        self.endpoint = endpoint
        self.layout = layout_of(parts.pool)
        self.rooms: dict[int, _Room] = {}
        self.room_of_rid: dict[str, int] = {}  # every request in `rooms`, by its rid
        # Pulls for rooms whose request has not arrived yet (the gateway sends both requests
        # at once), and rooms that ended badly, so a late pull is answered at once.
        self.early: dict[int, tuple[bytes, KVPull, float]] = {}
        self.ended: dict[int, tuple[str, float]] = {}

    def adopt(self, req: Req, bootstrap: Bootstrap) -> bool:
        if bootstrap.room in self.rooms:
            raise ValueError(f"bootstrap_room {bootstrap.room} is already in use here")
        if req.rid in self.room_of_rid:
            raise ValueError(f"request {req.rid} already holds a bootstrap_room here")
        req.sampling_params.max_new_tokens = 1  # the decode server generates the rest
        room = _Room(req)
        self.rooms[bootstrap.room] = room
        self.room_of_rid[req.rid] = bootstrap.room
        early = self.early.pop(bootstrap.room, None)
        if early is not None:
            room.pull = (early[0], early[1])
        return False

    def hold(self, req: Req) -> bool:
        room = self._room_of(req)
        if room is None or req.failed or room[1].cancelled:
            if room is not None:
                self._forget(req, "its prefill failed" if req.failed else "cancelled")
            return False
        room[1].held_since = time.monotonic()
        return True

    def holding(self) -> list[Req]:
        return [r.req for r in self.rooms.values() if r.held_since]

    @property
    def queued(self) -> int:
        return sum(1 for r in self.rooms.values() if r.held_since)

    def poll(self, running: list[Req], waiting: list[Req]) -> list[ReqOutput]:
        outs: list[ReqOutput] = []
        for peer, msg in self.endpoint.receive():
            if isinstance(msg, KVPull):
                self._take_pull(peer, msg)
            elif isinstance(msg, KVCancel):
                outs += self._cancel(msg.room)
        now = time.monotonic()
        for number, room in list(self.rooms.items()):
            if room.held_since and room.pull is not None:
                outs.append(self._transfer(number, room))
            elif room.held_since and now - room.held_since > self.timeout:
                reason = f"no decode server asked for room {number} within {self.timeout:g} s"
                outs.append(self._end_held(number, room, reason))
            elif room.pull is not None and now - room.told_at > self.timeout / 3:
                self.endpoint.send(room.pull[0], KVWait(number))  # still computing it
                room.told_at = now
        self._expire(now)
        return outs

    def abort(self, rid: str) -> list[ReqOutput]:
        number = self.room_of_rid.get(rid)
        if number is None:
            return []
        room = self.rooms[number]
        if room.held_since:
            return [self._end_held(number, room, "aborted by the client")]
        self._forget(room.req, "aborted by the client")  # the scheduler ends the request
        return []

    def close(self) -> None:
        self.endpoint.close()

    # -- the transfer -----------------------------------------------------------------------
    def _take_pull(self, peer: bytes, pull: KVPull) -> None:
        room = self.rooms.get(pull.room)
        if room is not None:
            room.pull = (peer, pull)
        elif pull.room in self.ended:
            self.endpoint.send(peer, KVPages(pull.room, False, self.ended[pull.room][0]))
        else:
            self.early[pull.room] = (peer, pull, time.monotonic())

    def _transfer(self, number: int, room: _Room) -> ReqOutput:
        assert room.pull is not None
        peer, pull = room.pull
        req = room.req
        problem = self._mismatch(req, pull)
        if problem:
            return self._end_held(number, room, problem)  # which tells the decode server
        started = time.perf_counter()
        prompt_len = len(req.origin_input_ids)
        frames = read_slots(self.parts.pool, self.kv.slots(req, pull.skip, prompt_len))
        header = KVPages(number, True, count=prompt_len - pull.skip, first_token=req.output_ids[0])
        if req.return_logprob and req.output_token_logprobs:
            header.logprob = req.output_token_logprobs[0][0]
            header.top_logprobs = req.output_top_logprobs[0]
            if req.output_token_ids_logprobs:
                header.ids_logprobs = req.output_token_ids_logprobs[0]
        if not self.endpoint.send(peer, header, frames):
            return self._end_held(number, room, f"the decode server of room {number} is gone")
        self.count_transfer(header.count, sum(len(f) for f in frames), started)
        self._drop(number)
        return self._release(req)

    def _mismatch(self, req: Req, pull: KVPull) -> str:
        """Why the pull cannot be served from this request ("" if it can)."""
        prompt_len = len(req.origin_input_ids)
        if pull.layout != self.layout:
            return f"KV layouts differ: prefill {self.layout}, decode {pull.layout}"
        if pull.prompt_len != prompt_len or pull.digest != prompt_digest(req.origin_input_ids):
            return f"the prompts of room {pull.room} differ between the two servers"
        if not 0 <= pull.skip <= prompt_len:
            return f"skip {pull.skip} is outside the prompt's {prompt_len} tokens"
        return ""

    # -- endings ----------------------------------------------------------------------------
    def _end_held(self, number: int, room: _Room, reason: str) -> ReqOutput:
        """A held request that will not be sent: fail it, free its pages, answer its pull."""
        logger.warning("room %d (request %s): %s", number, room.req.rid, reason)
        self.stats.disagg_transfer_failures += 1
        if room.pull is not None:
            self.endpoint.send(room.pull[0], KVPages(number, False, reason))
        self._drop(number)
        self.ended[number] = (reason, time.monotonic())
        room.req.finish_reason = {"type": "abort", "message": reason}
        return self._release(room.req)

    def _release(self, req: Req) -> ReqOutput:
        self.kv.release(req)  # the prompt's pages stay in this server's cache
        self.stats.finished(len(req.output_ids), req.cached_tokens)
        return make_output(req)

    def _cancel(self, number: int) -> list[ReqOutput]:
        """The decode server gave the room up: a held request ends now; one still prefilling
        goes on (its prompt fills the cache) and is released as any request when done."""
        room = self.rooms.get(number)
        if room is None:
            self.early.pop(number, None)
            return []
        if room.held_since:
            return [self._end_held(number, room, "the decode server cancelled the room")]
        room.pull, room.cancelled = None, True
        return []

    def _forget(self, req: Req, reason: str) -> None:
        """A request with a room ends without being sent: a pull, now or later, is refused."""
        found = self._room_of(req)
        if found is not None:
            number, room = found
            self._drop(number)
            self.ended[number] = (reason, time.monotonic())
            if room.pull is not None:
                self.endpoint.send(room.pull[0], KVPages(number, False, reason))

    def _room_of(self, req: Req) -> tuple[int, _Room] | None:
        number = self.room_of_rid.get(req.rid)
        if number is None or self.rooms[number].req is not req:
            return None
        return number, self.rooms[number]

    def _drop(self, number: int) -> None:
        del self.room_of_rid[self.rooms.pop(number).req.rid]

    def _expire(self, now: float) -> None:
        """Pulls for rooms that never came are refused; old endings are forgotten."""
        for number, (peer, _, since) in list(self.early.items()):
            if now - since > self.timeout:
                del self.early[number]
                reason = f"room {number} never reached this prefill server"
                self.endpoint.send(peer, KVPages(number, False, reason))
                self.stats.disagg_transfer_failures += 1
        for number, (_, since) in list(self.ended.items()):
            if now - since > 2 * self.timeout:
                del self.ended[number]
