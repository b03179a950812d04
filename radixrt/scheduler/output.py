"""After a forward: pick the logit rows, sample, record logprobs, decide who finished.

Whatever goes wrong for one request here (its grammar refuses a token or allows none, a stop
regex runs away, its logprobs cannot be recorded) ends that request alone, with finish reason
abort and a message; the rest of the batch goes on and the step loop keeps serving.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from radixrt.errors import RequestFailed
from radixrt.executor.logprobs import compute_logprobs
from radixrt.executor.sampler import NO_TOKEN
from radixrt.protocol.messages import DetokParams, ReqOutput
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.draft_rows import kept_drafts, row_spans, sample_rows
from radixrt.scheduler.req import Req
from radixrt.scheduler.schedule_batch import LogitRows
from radixrt.scheduler.speculation import Speculator
from radixrt.scheduler.stats import SchedulerStats
from radixrt.scheduler.stops import matched_stop_regex, matched_stop_string
from radixrt.scheduler.structured import StructuredGeneration

logger = logging.getLogger(__name__)
# Prompt logprobs are computed this many rows at a time: a [rows, vocab] float32 log_softmax
# per slice (50 MB for a 49k vocabulary), not one for the whole prefill chunk.
PROMPT_LOGPROB_ROWS = 256


def rows_of(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """logits[rows]: a view when the rows are consecutive (a decode batch's usually are), not
    a copy of [rows, vocab] floats (1 ms a step at batch 64 with a 49k vocabulary)."""
    first = rows[0]
    if rows == list(range(first, first + len(rows))):
        return logits[first : first + len(rows)]
    return logits[rows]


class OutputProcessor:
    def __init__(
        self,
        eos_token_ids: list[int],
        vocab_size: int,
        context_length: int,
        structured: StructuredGeneration,
        stats: SchedulerStats,
        tokenizer: Any = None,
        device: str = "cpu",
        truncate_kv: Callable[[Req, int], None] | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        """`stats`: counts the requests that fail here; `truncate_kv` (KVManager.truncate)
        drops the K/V of rejected drafts; `speculator` drafts tokens (None: speculation off)."""
        self.structured = structured
        self.truncate_kv = truncate_kv if truncate_kv is not None else _no_kv
        self.speculator = speculator
        self.stats = stats
        self.eos_token_ids = set(eos_token_ids)
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.tokenizer = tokenizer
        self.device = device

    def process(self, plan: LogitRows, logits: torch.Tensor) -> None:
        """Record logprobs, settle proposals, sample; a request that fails is ended alone."""
        for req, first_t, idx in plan.prompt_lp:
            self._guarded(
                req,
                "recording its prompt logprobs",
                self._record_prompt_logprobs,
                req,
                first_t,
                logits[idx],
            )
        for req in plan.prefill_only:
            if not req.finished:
                req.finish_reason = {"type": "length", "length": 0}
        # Beam groups rank their rows themselves (scheduler/beam_search.py).
        live = [i for i, r in enumerate(plan.sample_reqs) if not r.finished and r.beam is None]
        if not live:
            return
        reqs = [plan.sample_reqs[i] for i in live]
        drafts = [plan.sample_drafts[i] for i in live]
        rows = [plan.sample_rows[i] + j for i in live for j in range(plan.sample_drafts[i] + 1)]
        sample_logits = rows_of(logits, rows)
        self.structured.mask(reqs, drafts, sample_logits, self._guarded)
        picks = self._sample(reqs, drafts, sample_logits)
        for req, k, (start, n) in zip(reqs, drafts, row_spans(drafts), strict=True):
            if req.finished:  # its mask failed
                continue
            self._guarded(
                req,
                "taking its next tokens",
                self._settle_rows,
                req,
                k,
                picks[start : start + n],
                sample_logits[start : start + n],
            )

    def fail(self, req: Req, message: str, exc: BaseException | None = None) -> None:
        """End `req` alone (finish reason abort, `message`); the scheduler releases it."""
        self.stats.failed_requests += 1
        logger.warning(
            "request %s ended with an error: %s",
            req.rid,
            message,
            exc_info=exc if exc is not None and not isinstance(exc, RequestFailed) else None,
        )
        req.fail(message)

    def _guarded(self, req: Req, doing: str, fn: Callable[..., Any], *args: Any) -> bool:
        """fn(*args); if it raises, `req` fails with a message that says what it was doing.
        Returns whether fn succeeded."""
        try:
            fn(*args)
            return True
        except Exception as e:  # noqa: BLE001 - one request's failure must not stop the loop
            message = (
                str(e)
                if isinstance(e, RequestFailed)
                else f"internal error while {doing}: {type(e).__name__}: {e}"
            )
            self.fail(req, message, e)
            return False

    def _sample(self, reqs: list[Req], drafts: list[int], logits: torch.Tensor) -> list[int]:
        """Every row's pick in one batched draw; if that raises, each request's rows alone,
        so that only the requests that fail by themselves fail."""
        eos = sorted(self.eos_token_ids)
        try:
            return sample_rows(reqs, drafts, logits, self.vocab_size, eos)
        except Exception:  # noqa: BLE001 - find the request it came from
            logger.warning("sampling the batch failed; sampling its rows one by one", exc_info=True)
        picks: list[int] = []
        for req, k, (start, n) in zip(reqs, drafts, row_spans(drafts), strict=True):
            try:
                picks.extend(
                    sample_rows([req], [k], logits[start : start + n], self.vocab_size, eos)
                )
            except Exception as e:  # noqa: BLE001
                self.fail(req, f"internal error while sampling: {type(e).__name__}: {e}", e)
                picks.extend([NO_TOKEN] * n)
        return picks

    def _settle_rows(self, req: Req, k: int, picks: list[int], logits: torch.Tensor) -> None:
        """Keep the drafts the rows confirm and the token after them, one at a time (a stop
        or the length limit inside the run ends it there); K/V past them is dropped; then
        new drafts are proposed."""
        out = req.output_ids
        drafts = out[len(out) - k :] if k else []
        kept = kept_drafts(picks, drafts)
        tokens = drafts[:kept] + [picks[kept]]
        self._count_verified(req, k, kept)
        if k:
            req.drop_unverified()  # the matcher steps back too: the kept ones are taken below
        taken = 0
        for tok in tokens:
            if tok == NO_TOKEN:
                allows = bool(torch.isfinite(logits[taken]).any())
                raise RequestFailed(req.no_token_message(allows))
            self._take_token(req, tok)
            taken += 1
            if req.finished:
                break
        if req.kv_len > req.seq_len - 1:
            self.truncate_kv(req, req.seq_len - 1)
        if req.return_logprob:
            self._record_output_logprobs(req, logits[:taken], tokens[:taken])
        if not req.finished:
            self._propose(req)

    def _count_verified(self, req: Req, drafted: int, kept: int) -> None:
        """Count a decode step's drafts: jump-forward's, or speculation's (which counts every
        decode step of a request, as SGLang's spec_verify_ct)."""
        if drafted and req.draft_kind == "jump":
            self.stats.jump_forward_tokens += kept
            drafted = kept = 0
        if self.speculator is not None and len(req.output_ids) > drafted:
            self.speculator.verified(req, drafted, kept)

    def _propose(self, req: Req) -> None:
        """Draft the request's next tokens: what its grammar forces (jump-forward), else what
        speculation guesses."""
        self.structured.propose(req)
        if not req.unverified and self.speculator is not None:
            self.speculator.propose(req, self.structured)

    def take_transferred(
        self,
        req: Req,
        tok: int,
        logprob: tuple[float, list[tuple[float, int]], list[tuple[float, int]] | None] | None,
    ) -> None:
        """Take a first token another server sampled (prefill/decode disaggregation) as if
        this step had: stops, the grammar, then the logprob entries it computed (logprob,
        top logprobs, token_ids_logprob's), then the next drafts."""
        self._take_token(req, tok)
        if req.return_logprob and logprob is not None:
            value, top, ids = logprob
            req.output_token_logprobs.append((value, tok))
            req.output_top_logprobs.append(top)
            if req.token_ids_logprob:
                req.output_token_ids_logprobs.append(ids or [])
        if not req.finished:
            self._propose(req)

    def _take_token(self, req: Req, tok: int) -> None:
        req.output_ids.append(tok)
        if req.grammar is not None:
            self.structured.accept(req, tok)
        if not req.finished:
            self._check_finished(req, tok)

    def _record_prompt_logprobs(self, req: Req, first_t: int, logits: torch.Tensor) -> None:
        for lo in range(0, logits.shape[0], PROMPT_LOGPROB_ROWS):
            self._record_prompt_slice(req, first_t + lo, logits[lo : lo + PROMPT_LOGPROB_ROWS])

    def _record_prompt_slice(self, req: Req, first_t: int, logits: torch.Tensor) -> None:
        tokens = req.origin_input_ids[first_t : first_t + logits.shape[0]]
        lp, top_v, top_i, every = compute_logprobs(
            logits, torch.tensor(tokens), req.top_logprobs_num
        )
        req.input_token_logprobs.extend(zip(lp.tolist(), tokens, strict=True))
        req.input_top_logprobs.extend(_top_pairs(top_v, top_i, req.top_logprobs_num))
        req.input_logprobs_count += len(tokens)
        if req.token_ids_logprob:
            req.input_token_ids_logprobs.extend(_ids_pairs(every, req.token_ids_logprob))

    def _record_output_logprobs(self, req: Req, logits: torch.Tensor, tokens: list[int]) -> None:
        """The logprobs of the tokens just taken, from their rows (masked by the grammar, before
        penalties: as a step without drafts records them)."""
        if not tokens:
            return
        lp, top_v, top_i, every = compute_logprobs(
            logits, torch.tensor(tokens), req.top_logprobs_num
        )
        req.output_token_logprobs.extend(zip(lp.tolist(), tokens, strict=True))
        req.output_top_logprobs.extend(_top_pairs(top_v, top_i, req.top_logprobs_num))
        if req.token_ids_logprob:
            req.output_token_ids_logprobs.extend(_ids_pairs(every, req.token_ids_logprob))

    def _check_finished(self, req: Req, tok: int) -> None:
        sp = req.sampling_params
        if len(req.output_ids) >= sp.min_new_tokens:
            if tok in (sp.stop_token_ids or ()) or (
                not sp.ignore_eos and tok in self.eos_token_ids
            ):
                req.finish_reason = {"type": "stop", "matched": tok}
                return
            matched = matched_stop_string(req, self.tokenizer)
            if matched is None:
                matched = matched_stop_regex(req, self.tokenizer)
            if matched is not None:  # SGLang: the stop string, or the regex's pattern
                req.finish_reason = {"type": "stop", "matched": matched}
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = {"type": "length", "length": req.max_new_tokens}
        elif req.seq_len >= self.context_length:
            req.finish_reason = {"type": "length", "length": len(req.output_ids)}


def _no_kv(req: Req, length: int) -> None:
    raise AssertionError("drafts were verified without a KV manager to drop rejected ones")


def _ids_pairs(logprobs: torch.Tensor, ids: list[int]) -> list[list[tuple[float, int]]]:
    """Per row of logprobs [N, V], the (logprob, id) of each of `ids`."""
    return [list(zip(row, ids, strict=True)) for row in logprobs[:, ids].tolist()]


def _top_pairs(
    values: torch.Tensor, indices: torch.Tensor, k: int
) -> list[list[tuple[float, int]]]:
    if k <= 0:
        return [[] for _ in range(values.shape[0])]
    return [
        list(zip(v[:k].tolist(), i[:k].tolist(), strict=True))
        for v, i in zip(values, indices, strict=True)
    ]


def make_output(req: Req) -> ReqOutput:
    """The delta of everything the request produced since it last emitted; clears the deltas."""
    end = req.num_emittable
    new_ids = req.output_ids[req.num_sent_ids : end]
    req.num_sent_ids = end
    want = req.return_logprob
    ids_want = want and bool(req.token_ids_logprob)
    out = ReqOutput(
        rid=req.rid,
        new_output_ids=new_ids,
        finished=req.finished,
        finish_reason=req.finish_reason,
        prompt_tokens=len(req.origin_input_ids),
        completion_tokens=end,
        cached_tokens=req.cached_tokens,
        output_token_logprobs=req.output_token_logprobs if want else None,
        output_top_logprobs=req.output_top_logprobs if want else None,
        input_token_logprobs=req.input_token_logprobs if want else None,
        input_top_logprobs=req.input_top_logprobs if want else None,
        output_token_ids_logprobs=req.output_token_ids_logprobs if ids_want else None,
        input_token_ids_logprobs=req.input_token_ids_logprobs if ids_want else None,
        detok=None if req.detok_sent else detok_params(req.sampling_params),
        admitted_at=req.admitted_at,
        first_token_at=req.first_token_at,
        spec=(req.spec_verify_ct, req.spec_drafted, req.spec_accepted)
        if req.spec_verify_ct
        else None,
    )
    req.detok_sent = True
    if want:
        req.output_token_logprobs, req.output_top_logprobs = [], []
        req.input_token_logprobs, req.input_top_logprobs = [], []
        req.output_token_ids_logprobs, req.input_token_ids_logprobs = [], []
    return out


def detok_params(params: SamplingParams) -> DetokParams:
    return DetokParams(
        params.skip_special_tokens,
        params.spaces_between_special_tokens,
        list(params.stop or []),
        params.no_stop_trim,
        list(params.stop_regex or []),
    )
