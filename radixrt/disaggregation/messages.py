"""What a prefill server and a decode server say to each other about one room (the transfer
of one request's KV pages), encoded with msgspec: never a pickle.

A decode server asks with `KVPull` (after matching the prompt in its own radix cache: it asks
only for positions `skip` onwards), or gives a room up with `KVCancel`. The prefill server
answers a pull with one `KVPages` header followed by the raw pages, or a header with `ok`
false and the reason; while the room's prompt is still being computed, a `KVWait` now and
then says it is alive. Rooms are SGLang's `bootstrap_room`s: the gateway draws one per request
and gives it to both servers. Every header goes out after its `sign()` tag under the shared
bootstrap key, and one whose tag does not verify is never acted on.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from typing import Any

import msgspec


class KVPoll(enum.IntEnum):
    """A room's state, with SGLang's names and values (disaggregation/base/conn.py): it only
    moves up, except that Failed ends it from any state."""

    Failed = 0
    Bootstrapping = 1  # the request is known here; the peer has not been heard from
    WaitingForInput = 2  # decode: pages asked for; prefill: the peer's pull is here
    Transferring = 3
    Success = 4


class KVLayout(msgspec.Struct, frozen=True):
    """What a page is made of: both sides must agree, or the bytes mean nothing."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str


class KVPull(msgspec.Struct, tag="pull"):
    """Send me the K/V of `room`'s prompt from position `skip` on (its first `skip` positions
    are in my own cache), with the first output token."""

    room: int
    prompt_len: int
    skip: int
    digest: str  # prompt_digest() of the prompt's ids: the two sides must mean one prompt
    layout: KVLayout


class KVCancel(msgspec.Struct, tag="cancel"):
    """The decode side gave the room up (its client aborted, or it stopped waiting)."""

    room: int


class KVPages(msgspec.Struct, tag="pages"):
    """The answer to a pull. With `ok`, 2 x layers raw frames follow (K then V of each layer,
    [count, kv_heads, head_dim] in the layout's dtype each) for positions skip..skip+count,
    and the first output token with its logprob entries (when the request asked for them)."""

    room: int
    ok: bool
    reason: str = ""
    count: int = 0
    first_token: int = -1
    logprob: float | None = None
    top_logprobs: list[tuple[float, int]] | None = None
    ids_logprobs: list[tuple[float, int]] | None = None


class KVWait(msgspec.Struct, tag="wait"):
    """The prefill server has the room and is still computing it: the decode server's
    timeout counts silence, so a long queue there is not taken for a dead peer."""

    room: int


ToPrefill = KVPull | KVCancel
ToDecode = KVPages | KVWait
_TO_PREFILL = msgspec.msgpack.Decoder(ToPrefill)
_TO_DECODE = msgspec.msgpack.Decoder(ToDecode)
_ENCODER = msgspec.msgpack.Encoder()


def encode(msg: Any) -> bytes:
    return _ENCODER.encode(msg)


def decode_to_prefill(data: bytes) -> KVPull | KVCancel:
    return _TO_PREFILL.decode(data)


def decode_to_decode(data: bytes) -> KVPages | KVWait:
    return _TO_DECODE.decode(data)


def sign(key: bytes, header: bytes) -> bytes:
    """The tag that travels before a header: HMAC-SHA256 of its bytes under the shared
    bootstrap key; empty without a key. It covers the header (room, counts, first token),
    not the K/V frames after it: hashing every page would cost about what moving it does."""
    return hmac.new(key, header, hashlib.sha256).digest() if key else b""


def signed_by(key: bytes, header: bytes, tag: bytes) -> bool:
    """Whether `tag` is the header's under `key`, compared in constant time (so a wrong tag
    reveals nothing of the right one by how long it takes to refuse)."""
    return hmac.compare_digest(tag, sign(key, header))


def prompt_digest(ids: list[int]) -> str:
    """A short hash of a prompt's token ids."""
    raw = b"".join(i.to_bytes(4, "little", signed=True) for i in ids)
    return hashlib.blake2b(raw, digest_size=12).hexdigest()
