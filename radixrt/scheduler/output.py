"""After a forward: pick the logit rows, sample, record logprobs, decide who finished."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from radixrt.executor.logprobs import compute_logprobs
from radixrt.executor.sampler import SamplingBatch, sample
from radixrt.grammar.jump_forward import propose
from radixrt.messages import DetokParams, ReqOutput
from radixrt.scheduler.jump_verify import verify_proposal
from radixrt.scheduler.req import Req


@dataclass
class RowPlan:
    """Which rows of the step's flattened tokens need logits, and for what."""

    rows: list[int] = field(default_factory=list)
    sample_reqs: list[Req] = field(default_factory=list)  # in the order of their rows
    sample_rows: list[int] = field(default_factory=list)  # positions within `rows`
    # (req, first prompt token index t, positions within `rows` of rows t-1 ...)
    prompt_lp: list[tuple[Req, int, list[int]]] = field(default_factory=list)
    # Requests with max_new_tokens == 0 whose prompt is now prefilled: they end without a
    # sample (SGLang's prefill-only requests: cache a prefix, or score it with logprobs).
    prefill_only: list[Req] = field(default_factory=list)
    # Requests whose jump-forward proposal the model checks now: (req, positions in `rows`).
    verify: list[tuple[Req, list[int]]] = field(default_factory=list)


def plan_rows(work: list[tuple[Req, int]]) -> RowPlan:
    plan = RowPlan()
    offset = 0
    for req, n in work:
        start = req.kv_len - n  # kv_len was already advanced by this step's n tokens
        first_t, last_t = _prompt_logprob_span(req, start, n)
        if first_t <= last_t:
            idx = list(range(len(plan.rows), len(plan.rows) + last_t - first_t + 1))
            plan.rows.extend(offset + (t - 1 - start) for t in range(first_t, last_t + 1))
            plan.prompt_lp.append((req, first_t, idx))
        if req.kv_len == req.seq_len and req.num_unverified:
            k = req.num_unverified  # the planner computes a proposal in one step
            assert n > k, (n, k)
            plan.verify.append((req, list(range(len(plan.rows), len(plan.rows) + k + 1))))
            plan.rows.extend(offset + n - 1 - k + j for j in range(k + 1))
        elif req.kv_len == req.seq_len and req.sampling_params.max_new_tokens == 0:
            plan.prefill_only.append(req)
        elif req.kv_len == req.seq_len:
            plan.sample_rows.append(len(plan.rows))
            plan.rows.append(offset + n - 1)
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


class OutputProcessor:
    def __init__(self, eos_token_ids: list[int], vocab_size: int, context_length: int,
                 tokenizer=None, device: str = "cpu", jump_forward: bool = True,
                 truncate_kv: Callable[[Req, int], None] | None = None) -> None:
        self.grammar = None  # the GrammarBackend, set by the scheduler at the first constraint
        self.truncate_kv = truncate_kv  # KVManager.truncate: drops a rejected proposal's K/V
        self.jump_forward = jump_forward
        self.jump_forward_tokens = 0
        self.eos_token_ids = set(eos_token_ids)
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.tokenizer = tokenizer
        self.device = device

    def process(self, plan: RowPlan, logits: torch.Tensor) -> None:
        for req, first_t, idx in plan.prompt_lp:
            self._record_prompt_logprobs(req, first_t, logits[idx])
        for req in plan.prefill_only:
            req.finish_reason = {"type": "length", "length": 0}
        for req, idx in plan.verify:
            tok, kept = verify_proposal(req, logits[idx], self.grammar, self.vocab_size,
                                        sorted(self.eos_token_ids), self.truncate_kv)
            self.jump_forward_tokens += kept
            self._advance_grammar(req, tok)
        if not plan.sample_reqs:
            return
        reqs = plan.sample_reqs
        sample_logits = logits[plan.sample_rows]
        constrained = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if constrained:
            self.grammar.apply_masks(sample_logits, [reqs[i].grammar for i in constrained],
                                     constrained)
        batch = SamplingBatch.build(
            [r.sampling_params for r in reqs], [r.generator for r in reqs],
            [r.output_ids for r in reqs], [r.origin_input_ids for r in reqs],
            self.vocab_size, sample_logits.device, eos_token_ids=sorted(self.eos_token_ids))
        next_ids = sample(sample_logits, batch).tolist()
        self._record_output_logprobs(reqs, sample_logits, next_ids)
        for req, tok in zip(reqs, next_ids):
            req.output_ids.append(tok)
            if req.grammar is not None:
                self._advance_grammar(req, tok)
            else:
                self._check_finished(req, tok)

    def _advance_grammar(self, req: Req, tok: int) -> None:
        """The matcher takes the sampled token; the request ends when its grammar is complete,
        else the text the grammar now fixes is proposed at once (jump-forward)."""
        accepted = req.grammar.accept_token(tok)
        assert accepted, f"the grammar refused token {tok} its own mask allowed"
        if req.grammar.is_terminated():
            req.finish_reason = {"type": "stop", "matched": tok}
            return
        self._check_finished(req, tok)
        if req.finished or not self.jump_forward or req.return_logprob:
            return
        # Room for the proposal and the token sampled after it.
        proposal = propose(req.grammar, self.tokenizer, req.remaining_new_tokens - 1)
        req.output_ids.extend(proposal)
        req.num_unverified = len(proposal)

    def _record_prompt_logprobs(self, req: Req, first_t: int, logits: torch.Tensor) -> None:
        tokens = req.origin_input_ids[first_t:first_t + logits.shape[0]]
        lp, top_v, top_i, every = compute_logprobs(logits, torch.tensor(tokens),
                                                   req.top_logprobs_num)
        req.input_token_logprobs.extend(zip(lp.tolist(), tokens))
        req.input_top_logprobs.extend(_top_pairs(top_v, top_i, req.top_logprobs_num))
        req.input_logprobs_count += len(tokens)
        if req.token_ids_logprob:
            req.input_token_ids_logprobs.extend(_ids_pairs(every, req.token_ids_logprob))

    def _record_output_logprobs(self, reqs: list[Req], logits: torch.Tensor,
                                next_ids: list[int]) -> None:
        rows = [i for i, r in enumerate(reqs) if r.return_logprob]
        if not rows:
            return
        k = max(reqs[i].top_logprobs_num for i in rows)
        lp, top_v, top_i, every = compute_logprobs(logits[rows], torch.tensor(next_ids)[rows], k)
        for j, i in enumerate(rows):
            req = reqs[i]
            req.output_token_logprobs.append((float(lp[j]), next_ids[i]))
            req.output_top_logprobs.extend(
                _top_pairs(top_v[j:j + 1], top_i[j:j + 1], req.top_logprobs_num))
            if req.token_ids_logprob:
                req.output_token_ids_logprobs.extend(
                    _ids_pairs(every[j:j + 1], req.token_ids_logprob))

    def _check_finished(self, req: Req, tok: int) -> None:
        sp = req.sampling_params
        if len(req.output_ids) >= sp.min_new_tokens:
            if tok in (sp.stop_token_ids or ()) or (
                not sp.ignore_eos and tok in self.eos_token_ids
            ):
                req.finish_reason = {"type": "stop", "matched": tok}
                return
            matched = self._matched_stop_string(req)
            if matched is None:
                matched = self._matched_stop_regex(req)
            if matched is not None:  # SGLang: the stop string, or the regex's pattern
                req.finish_reason = {"type": "stop", "matched": matched}
                return
        if len(req.output_ids) >= sp.max_new_tokens:
            req.finish_reason = {"type": "length", "length": sp.max_new_tokens}
        elif req.seq_len >= self.context_length:
            req.finish_reason = {"type": "length", "length": len(req.output_ids)}

    def _matched_stop_string(self, req: Req) -> str | None:
        stops = req.sampling_params.stop
        if not stops or self.tokenizer is None:
            return None
        # A stop string can only newly appear in text ending with the newest token; a token
        # holds at least one character, so this many tail tokens cover the longest stop.
        tail = req.output_ids[-(max(len(s) for s in stops) + 2):]
        text = self.tokenizer.decode(tail, skip_special_tokens=False)
        return next((s for s in stops if s in text), None)

    def _matched_stop_regex(self, req: Req) -> str | None:
        patterns = req.sampling_params.stop_regex
        if not patterns or self.tokenizer is None:
            return None
        compiled = [_compiled_stop_regex(p) for p in patterns]
        # The tail that holds any match ending at the newest token (all of it when a regex's
        # match has no bound), as for stop strings: a token holds at least one character.
        widths = [w for _, w in compiled]
        tail = req.output_ids if None in widths else req.output_ids[-(max(widths) + 2):]
        text = self.tokenizer.decode(tail, skip_special_tokens=False)
        return next((p for p, (rx, _) in zip(patterns, compiled) if rx.search(text)), None)


_MAX_STOP_REGEX_WIDTH = 4096  # wider than this: decode the whole output to search it


@functools.lru_cache(maxsize=1024)
def _compiled_stop_regex(pattern: str) -> tuple[re.Pattern, int | None]:
    """The compiled regex and the most characters a match can span (None: no bound)."""
    try:  # CPython's regex parser: the width bounds of a pattern
        from re import _parser
    except ImportError:  # Python < 3.11
        import sre_parse as _parser

    rx = re.compile(pattern)
    width = _parser.parse(pattern).getwidth()[1]
    return rx, (None if width >= _MAX_STOP_REGEX_WIDTH else width)


def _ids_pairs(logprobs: torch.Tensor, ids: list[int]) -> list[list[tuple[float, int]]]:
    """Per row of logprobs [N, V], the (logprob, id) of each of `ids`."""
    return [list(zip(row, ids)) for row in logprobs[:, ids].tolist()]


def _top_pairs(values: torch.Tensor, indices: torch.Tensor, k: int) -> list:
    if k <= 0:
        return [[] for _ in range(values.shape[0])]
    return [list(zip(v[:k].tolist(), i[:k].tolist())) for v, i in zip(values, indices)]


def make_output(req: Req) -> ReqOutput:
    """The delta of everything the request produced since it last emitted; clears the deltas."""
    end = req.num_emittable
    new_ids = req.output_ids[req.num_sent_ids:end]
    req.num_sent_ids = end
    want = req.return_logprob
    ids_want = want and bool(req.token_ids_logprob)
    out = ReqOutput(
        rid=req.rid, new_output_ids=new_ids, finished=req.finished,
        finish_reason=req.finish_reason, prompt_tokens=len(req.origin_input_ids),
        completion_tokens=end, cached_tokens=req.cached_tokens,
        output_token_logprobs=req.output_token_logprobs if want else None,
        output_top_logprobs=req.output_top_logprobs if want else None,
        input_token_logprobs=req.input_token_logprobs if want else None,
        input_top_logprobs=req.input_top_logprobs if want else None,
        output_token_ids_logprobs=req.output_token_ids_logprobs if ids_want else None,
        input_token_ids_logprobs=req.input_token_ids_logprobs if ids_want else None,
        detok=None if req.detok_sent else _detok_params(req.sampling_params),
        admitted_at=req.admitted_at, first_token_at=req.first_token_at,
    )
    req.detok_sent = True
    if want:
        req.output_token_logprobs, req.output_top_logprobs = [], []
        req.input_token_logprobs, req.input_top_logprobs = [], []
        req.output_token_ids_logprobs, req.input_token_ids_logprobs = [], []
    return out


def _detok_params(params) -> DetokParams:
    return DetokParams(params.skip_special_tokens, params.spaces_between_special_tokens,
                       list(params.stop or []), params.no_stop_trim,
                       list(params.stop_regex or []))
