"""Every message that crosses between the frontend (Engine / tokenizer manager) and the scheduler.

They are msgspec Structs, encoded with msgspec.msgpack; a tagged union lets one socket carry
several kinds. Nothing read from a socket is ever unpickled.
"""

from __future__ import annotations

from typing import Any

import msgspec

from radixrt.protocol.request_input import GenerateReqInput


class GenerateReq(msgspec.Struct, tag="generate"):
    """One tokenized request (n > 1 sampling is expanded into n of these before it reaches the
    scheduler; a beam search is one, whose n results come back under `beam_rids`)."""

    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs; k >= 0: prompt logprobs from token k
    top_logprobs_num: int = 0
    stream: bool = False
    token_ids_logprob: list[int] | None = None  # logprobs of these ids at every position
    # Beam search (beam_width > 1): the rids its n results go out under (None: [rid]).
    beam_rids: list[str] | None = None
    # Prefill/decode disaggregation: where this request's KV pages come from or go to.
    bootstrap: Bootstrap | None = None


class Bootstrap(msgspec.Struct, frozen=True):
    """SGLang's bootstrap fields of one request (one of n): the prefill server's host and
    bootstrap port, and the room both servers know the transfer by."""

    host: str
    port: int
    room: int


class AbortReq(msgspec.Struct, tag="abort"):
    rid: str


# The abort finish reason's message for a request an AbortReq ended (the metrics' "abort"
# label keys on it; every other abort is a failure, "error").
CLIENT_ABORT_MESSAGE = "aborted by the client"


class FlushCacheReq(msgspec.Struct, tag="flush_cache"):
    pass


class ShutdownReq(msgspec.Struct, tag="shutdown"):
    pass


class GetStatsReq(msgspec.Struct, tag="get_stats"):
    """Ask for the scheduler's counters; with check_kv, also run the KV accounting check."""

    check_kv: bool = False


# /cache_tree's bounds (the HTTP server refuses values outside them; the scheduler clamps).
# A described node costs the scheduler some 10-30 us: 1000 of them stay within a step or two.
MAX_CACHE_TREE_DEPTH = 64
MAX_CACHE_TREE_NODES = 1000


class GetCacheTreeReq(msgspec.Struct, tag="get_cache_tree"):
    """Ask for a bounded snapshot of the prefix cache, the KV pool and the queues
    (scheduler/cache_snapshot.py): at most `max_nodes` tree nodes, `depth` levels deep."""

    depth: int = 6
    max_nodes: int = 200


class DetokParams(msgspec.Struct):
    """How a request's ids become text; sent with its first output for the detokenizer."""

    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop: list[str] = []
    no_stop_trim: bool = False
    stop_regex: list[str] = []


class ReqOutput(msgspec.Struct):
    """What one request produced since the last ReqOutput for it (the ids are a delta)."""

    rid: str
    new_output_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # Logprob deltas, present only when the request asked for them:
    # (logprob, token_id) pairs and, per token, a list of (logprob, token_id) alternatives.
    output_token_logprobs: list[tuple[float, int]] | None = None
    output_top_logprobs: list[list[tuple[float, int]]] | None = None
    input_token_logprobs: list[tuple[float | None, int]] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    # With token_ids_logprob: per position, the (logprob, token_id) of each asked-for id.
    output_token_ids_logprobs: list[list[tuple[float, int]]] | None = None
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] | None = None
    detok: DetokParams | None = None  # with the first output of a request only
    text: str | None = None  # the text delta, filled in by the detokenizer (process or thread)
    # Wall-clock times (time.time()) the scheduler stamped: admission to a batch, first token.
    admitted_at: float | None = None
    first_token_at: float | None = None
    # With speculative decoding: (decode steps, drafted tokens verified, drafts accepted) so far.
    spec: tuple[int, int, int] | None = None
    # Beam search: this result's length-penalized score (transformers' sequences_scores).
    beam_score: float | None = None
    beam_cum_logprob: float | None = None  # its log-probabilities' sum, unpenalized


class BatchOutput(msgspec.Struct, tag="batch_output"):
    outputs: list[ReqOutput]


class ControlReply(msgspec.Struct, tag="control_reply"):
    """The scheduler's answer to a control request (flush_cache, get_stats, get_cache_tree)."""

    kind: str
    success: bool
    message: str = ""
    stats: dict[str, Any] | None = None
    cache_tree: dict[str, Any] | None = None  # get_cache_tree's snapshot


class SchedulerReady(msgspec.Struct, tag="ready"):
    """Sent once by a scheduler that has loaded its model: what the frontend must know."""

    model_path: str
    vocab_size: int
    context_length: int
    pool_tokens: int
    max_prefill_tokens: int  # the step's prefill budget, resolved for the device
    eos_token_ids: list[int]
    dtype: str
    device: str
    attention_backend: str
    pid: int  # the scheduler's process


class SchedulerFailed(msgspec.Struct, tag="failed"):
    """Sent by a scheduler that could not start or whose loop raised."""

    error: str
    error_type: str = "RuntimeError"  # the exception's class name, to re-raise it alike


ToScheduler = GenerateReq | AbortReq | FlushCacheReq | ShutdownReq | GetStatsReq | GetCacheTreeReq
FromScheduler = BatchOutput | ControlReply | SchedulerReady | SchedulerFailed

_to_scheduler = msgspec.msgpack.Decoder(ToScheduler)
_from_scheduler = msgspec.msgpack.Decoder(FromScheduler)
_encoder = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_to_scheduler(data: bytes) -> ToScheduler:
    return _to_scheduler.decode(data)


def decode_from_scheduler(data: bytes) -> FromScheduler:
    return _from_scheduler.decode(data)


# -- the server's ZeroMQ frontend socket (the DSL's runtime backend talks to it) ---------------
# A client message is three frames: [request_id, api_key, payload]. The id and the key travel
# outside the payload so that the server checks the key (and can answer a wrong one by id)
# before it decodes anything a stranger sent; the payload's own request_id must match.
MAX_REQUEST_ID_BYTES = 256


def client_frames(
    msg: ClientGenerate | ClientAbort | ClientControl, api_key: str | None
) -> list[bytes]:
    return [msg.request_id.encode(), (api_key or "").encode(), encode(msg)]


class ClientGenerate(msgspec.Struct, tag="client_generate"):
    """One request (the struct /generate takes); replies carry the same request_id (chosen by
    the client)."""

    request_id: str
    request: GenerateReqInput


class ClientAbort(msgspec.Struct, tag="client_abort"):
    request_id: str


class ClientControl(msgspec.Struct, tag="client_control"):
    """kind: "flush_cache" or "get_server_info"."""

    request_id: str
    kind: str


class ClientReply(msgspec.Struct, tag="client_reply"):
    """kind: "chunk" (a stream delta, more follow), "result" (the last message: the output, or
    the control request's answer) or "error" (the last message: `error`, with an HTTP-like
    `status`: 400 bad request, 401 bad API key, 503 overloaded or stopped, 500 otherwise)."""

    request_id: str
    kind: str
    data: Any = None
    error: str = ""
    status: int = 200


FromClient = ClientGenerate | ClientAbort | ClientControl
_from_client = msgspec.msgpack.Decoder(FromClient)
_client_reply = msgspec.msgpack.Decoder(ClientReply)


def decode_from_client(data: bytes) -> FromClient:
    return _from_client.decode(data)


def decode_client_reply(data: bytes) -> ClientReply:
    return _client_reply.decode(data)
