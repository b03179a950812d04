"""A request as the scheduler tracks it: its tokens, its KV slots and its progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from radixrt.protocol.sampling_params import SamplingParams


@dataclass
class GrammarState:
    """A constrained request's grammar: its kind (regex, json_schema, ebnf) and its xgrammar
    matcher. The matcher has taken every id of output_ids, drafts included."""

    kind: str
    matcher: Any


@dataclass
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    generator: torch.Generator | None = None

    output_ids: list[int] = field(default_factory=list)
    # While running, the request holds row `table_row` of the request-to-token table, whose
    # first `num_slots` columns are the pool slots of its positions: [:tree_len] belong to the
    # prefix cache (locked through last_node), [tree_len:] are this request's private pages.
    table_row: int = -1
    num_slots: int = 0
    tree_len: int = 0
    last_node: Any = None
    kv_len: int = 0  # positions whose K/V is computed (committed after each forward)
    long_rope_kv: bool = False  # its K/V took LongRoPE's long frequencies (set on admission)
    cached_tokens: int = 0  # prompt tokens reused from the cache, reported to the user
    prefix_match_len: int = 0  # set by the policy each time the request is considered
    finish_reason: dict[str, Any] | None = None
    # Ended by a failure of its own (finish reason abort): its K/V may not match its tokens,
    # so none of it is published to the cache.
    failed: bool = False
    num_sent_ids: int = 0  # output ids already emitted (streaming deltas)
    # Logprob results not yet emitted.
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    input_logprobs_count: int = 0  # prompt logprobs computed so far (emitted or not)
    num_retractions: int = 0
    arrival_order: int = 0
    # Wall-clock stamps for the frontend's metrics (queue time, time to first token).
    admitted_at: float | None = None
    first_token_at: float | None = None
    detok_sent: bool = False  # whether an output carried this request's DetokParams yet
    grammar: GrammarState | None = None  # set once a constraint's grammar has compiled
    # Drafted tokens at the end of output_ids that the model has not checked yet (a
    # jump-forward proposal or a speculative draft): not emitted, checked by the next step,
    # dropped if the request is retracted first. `draft_kind` says where they came from.
    unverified: int = 0
    draft_kind: str = ""
    spec: Any = None  # the speculator's per-request state (scheduler/speculation.py)
    beam: Any = None  # the beam-search group it is a beam of (scheduler/beam_search.py)
    spec_verify_ct: int = 0  # steps that verified drafts (SGLang's spec_verify_ct)
    spec_drafted: int = 0  # drafted tokens verified, and of them accepted
    spec_accepted: int = 0
    # token_ids_logprob: ids whose logprob is reported at every position, and those not yet
    # emitted (per position, (logprob, id) for each id; None for the first prompt token).
    token_ids_logprob: list[int] | None = None
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The first prompt token has no logprob (nothing precedes it); its entry is there from
        # the start, so that a one-token prompt, which computes no prompt logprob, has it too.
        if self.return_logprob and self.logprob_start_len == 0 and self.origin_input_ids:
            self.input_token_logprobs.append((None, self.origin_input_ids[0]))
            self.input_top_logprobs.append(None)
            self.input_logprobs_count = 1
            if self.token_ids_logprob:
                self.input_token_ids_logprobs.append(None)

    @property
    def fill_ids(self) -> list[int]:
        """Every token whose K/V the request needs before it can sample its next token."""
        return self.origin_input_ids + self.output_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """fill_ids[start:end] without building fill_ids (the step loop calls this for every
        running request, mostly for one decode token)."""
        n_in = len(self.origin_input_ids)
        if start >= n_in:
            return self.output_ids[start - n_in : end - n_in]
        return self.origin_input_ids[start:end] + self.output_ids[: max(end - n_in, 0)]

    def fail(self, message: str) -> None:
        """End the request with finish reason abort and `message`. Unchecked drafts are
        dropped from the output (not from the matcher: it goes with the request)."""
        if self.unverified:
            del self.output_ids[-self.unverified :]
            self.unverified = 0
        self.failed = True
        self.finish_reason = {"type": "abort", "message": message}

    def no_token_message(self, grammar_allows_some: bool) -> str:
        """Why no token could be drawn for this request: its grammar allows none here, or what
        it allows is banned (min_new_tokens bans the end of sequence; stop_token_ids)."""
        kind, n = (self.grammar.kind if self.grammar else None), len(self.output_ids)
        if kind is None:
            return f"no token can follow output token {n}: the model's logits are not finite"
        if not grammar_allows_some:
            return (
                f"the {kind} constraint allows no token after {n} output tokens: no token "
                "of this model's vocabulary continues the text it has accepted"
            )
        min_new = self.sampling_params.min_new_tokens
        if n < min_new:
            return (
                f"min_new_tokens={min_new} bans the end of sequence until {min_new} tokens "
                f"are out, but the {kind} constraint allows nothing else after {n}"
            )
        return (
            f"every token the {kind} constraint allows after {n} output tokens is banned "
            "by the sampling parameters"
        )

    def drop_unverified(self) -> None:
        """Forget the unchecked drafts: out of output_ids, and the matcher steps back."""
        if self.unverified:
            del self.output_ids[-self.unverified :]
            if self.grammar is not None:
                self.grammar.matcher.rollback(self.unverified)
            self.unverified = 0

    @property
    def num_emittable(self) -> int:
        """Output ids the client may see: all but unchecked drafts."""
        return len(self.output_ids) - self.unverified

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def max_new_tokens(self) -> int:
        """The request's max_new_tokens (the scheduler fills it in when the user gave none)."""
        value = self.sampling_params.max_new_tokens
        assert value is not None, "max_new_tokens is filled in before the request is made"
        return value

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.max_new_tokens - len(self.output_ids), 0)

    @property
    def max_prefix_reuse(self) -> int:
        """How many leading tokens may come from the cache: at least one token must be computed
        to get logits to sample from, and prompt logprobs need rows from logprob_start_len - 1."""
        limit = self.seq_len - 1
        if self.return_logprob and self.logprob_start_len >= 0:
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return max(limit, 0)

    def private_pages(self, page_size: int) -> int:
        return -(-(self.num_slots - self.tree_len) // page_size)
