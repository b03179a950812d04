"""One step's batch: which requests compute which positions, and what each logit row is for.

The planner builds it (`ScheduleBatch.build`) after taking the slots; the model runner reads
its rows and lengths; `commit` advances the requests' computed length in one place, right after
the forward; the output processor reads `logits` to know which rows sample (a request with
k drafted tokens samples k + 1 rows, one per draft and one after them) and which record a
prompt logprob.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixrt.scheduler.req import Req


@dataclass(frozen=True)
class LogitRows:
    """Which of the step's flattened new tokens need logits, and for what. `rows` lists them
    (indices into the flattened tokens); the other fields point into `rows`."""

    rows: list[int] = field(default_factory=list)
    sample_reqs: list[Req] = field(default_factory=list)  # in the order of their rows
    # Per sampling request: the position within `rows` of its first row, and its drafts k
    # (its rows are k + 1 consecutive positions: each predicts a draft, the last what follows).
    sample_rows: list[int] = field(default_factory=list)
    sample_drafts: list[int] = field(default_factory=list)
    # (req, first prompt token index t, positions within `rows` of rows t-1 ...)
    prompt_lp: list[tuple[Req, int, list[int]]] = field(default_factory=list)
    # Requests with max_new_tokens == 0 whose prompt is prefilled now: they end without a
    # sample (SGLang's prefill-only requests: cache a prefix, or score it with logprobs).
    prefill_only: list[Req] = field(default_factory=list)


@dataclass(frozen=True)
class ScheduleBatch:
    """Request i computes positions prefix_lens[i] .. prefix_lens[i] + extend_lens[i] - 1, whose
    slots are in row table_rows[i] of the request-to-token table; `input_ids` holds those
    positions' tokens, flattened in request order; rope_lens[i] is the request's whole length
    (prompt and output so far, drafts included), which LongRoPE picks its frequencies by."""

    reqs: tuple[Req, ...]
    prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    table_rows: tuple[int, ...]
    input_ids: list[int]
    logits: LogitRows
    rope_lens: tuple[int, ...] = ()
    draft_lens: tuple[int, ...] = ()  # the unverified drafts each request computes now

    @classmethod
    def build(cls, work: list[tuple[Req, int]]) -> ScheduleBatch:
        """The batch of (request, new positions) pairs whose slots are allocated."""
        input_ids: list[int] = []
        for req, n in work:
            input_ids.extend(req.token_slice(req.kv_len, req.kv_len + n))
        return cls(
            reqs=tuple(r for r, _ in work),
            prefix_lens=tuple(r.kv_len for r, _ in work),
            extend_lens=tuple(n for _, n in work),
            table_rows=tuple(r.table_row for r, _ in work),
            input_ids=input_ids,
            logits=_logit_rows(work),
            rope_lens=tuple(r.seq_len for r, _ in work),
            draft_lens=tuple(r.unverified for r, _ in work),
        )

    @property
    def logit_rows(self) -> list[int]:
        return self.logits.rows

    @property
    def num_decodes(self) -> int:
        """Requests decoding this step (one new token, or drafts and the token they follow)."""
        pairs = zip(self.extend_lens, self.draft_lens, strict=True)
        return sum(1 for n, k in pairs if n == 1 + k)

    def __len__(self) -> int:
        return len(self.reqs)

    def commit(self) -> None:
        """The forward ran: each request's K/V now covers its new positions."""
        for req, prefix, n in zip(self.reqs, self.prefix_lens, self.extend_lens, strict=True):
            assert req.kv_len == prefix, (req.rid, req.kv_len, prefix)
            req.kv_len = prefix + n


def _logit_rows(work: list[tuple[Req, int]]) -> LogitRows:
    plan = LogitRows()
    offset = 0
    for req, n in work:
        start, end = req.kv_len, req.kv_len + n
        first_t, last_t = _prompt_logprob_span(req, start, n)
        if first_t <= last_t:
            idx = list(range(len(plan.rows), len(plan.rows) + last_t - first_t + 1))
            plan.rows.extend(offset + (t - 1 - start) for t in range(first_t, last_t + 1))
            plan.prompt_lp.append((req, first_t, idx))
        if end == req.seq_len and req.sampling_params.max_new_tokens == 0:
            plan.prefill_only.append(req)
        elif end == req.seq_len:
            k = req.unverified  # the planner computes drafts in one step with what precedes
            assert n > k, (n, k)
            plan.sample_rows.append(len(plan.rows))
            plan.sample_drafts.append(k)
            plan.rows.extend(offset + n - 1 - k + j for j in range(k + 1))
            plan.sample_reqs.append(req)
        offset += n
    return plan


def _prompt_logprob_span(req: Req, start: int, n: int) -> tuple[int, int]:
    """Prompt tokens t whose logprob comes from row t-1 computed in [start, start+n)."""
    if not req.return_logprob or req.logprob_start_len < 0:
        return 1, 0
    done = req.logprob_start_len + req.input_logprobs_count
    first = max(done, start + 1, 1)
    last = min(len(req.origin_input_ids) - 1, start + n)
    return first, last
