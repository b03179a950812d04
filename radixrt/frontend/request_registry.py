"""The frontend's table of live requests: rid -> ReqState, and the rids a caller may abort by.

A caller names a request by the rid it gave (or was given); one call may make several requests
(n samples: rid-0, rid-1, ...; a batch given one rid: rid_0, rid_1, ...), and aborting that rid
ends them all. Rids are matched exactly, never as prefixes: one client cannot reach another's
requests by guessing a common start (every server-made id starts with chatcmpl- or cmpl-).
"""

from __future__ import annotations

import threading

from radixrt.errors import ParamError
from radixrt.frontend.request_state import ReqState


class RequestRegistry:
    """Thread-safe: the dispatcher thread pops finished requests while callers register."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, ReqState] = {}
        self._groups: dict[str, set[str]] = {}  # a caller's rid -> the rids made from it
        self._keys_of: dict[str, set[str]] = {}  # a request's rid -> the group rids it is in

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

    def add(self, entries: list[tuple[ReqState, set[str]]]) -> None:
        """Register requests with the group rids each belongs to, all or none: a rid (or a
        group rid) already in use is a ParamError naming `rid` (HTTP 400)."""
        with self._lock:
            taken = self._states.keys() | self._groups.keys()
            for state, keys in entries:
                for key in ({state.rid} | keys) & taken:
                    raise ParamError(
                        "rid",
                        f"rid {key!r} is already in use by a running "
                        "request: give each request its own rid",
                    )
            for state, keys in entries:
                self._states[state.rid] = state
                self._keys_of[state.rid] = keys - {state.rid}
                for key in self._keys_of[state.rid]:
                    self._groups.setdefault(key, set()).add(state.rid)

    def get(self, rid: str, finished: bool = False) -> ReqState | None:
        """The live request with this rid; with finished, it leaves the table."""
        with self._lock:
            if not finished:
                return self._states.get(rid)
            return self._pop(rid)

    def remove(self, states: list[ReqState]) -> None:
        with self._lock:
            for state in states:
                self._pop(state.rid)

    def pop_all(self) -> list[ReqState]:
        with self._lock:
            states = list(self._states.values())
            self._states.clear()
            self._groups.clear()
            self._keys_of.clear()
        return states

    def abort_targets(self, rid: str, abort_all: bool = False) -> list[str]:
        """The live rids that aborting `rid` (or everything) reaches."""
        with self._lock:
            if abort_all:
                return list(self._states)
            if rid in self._groups:
                return sorted(self._groups[rid])
            return [rid] if rid in self._states else []

    def _pop(self, rid: str) -> ReqState | None:
        state = self._states.pop(rid, None)
        for key in self._keys_of.pop(rid, ()):
            members = self._groups.get(key)
            if members is not None:
                members.discard(rid)
                if not members:
                    del self._groups[key]
        return state
