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
from radixrt.executor.sampler import NO_TOKEN, SamplingBatch, sample
from radixrt.protocol.messages import DetokParams, ReqOutput
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.scheduler.req import Req
from radixrt.scheduler.schedule_batch import LogitRows
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
    ) -> None:
        """`stats`: counts the requests that fail here."""
        self.structured = structured
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
        for req, idx in plan.verify:
            if not req.finished:
                self._guarded(
                    req, "checking its jump-forward proposal", self._verify, req, logits[idx]
                )
        live = [i for i, r in enumerate(plan.sample_reqs) if not r.finished]
        if not live:
            return
        reqs = [plan.sample_reqs[i] for i in live]
        sample_logits = rows_of(logits, [plan.sample_rows[i] for i in live])
        self.structured.mask(reqs, sample_logits, self._guarded)
        next_ids = self._sample(reqs, sample_logits)
        self._record_output_logprobs(reqs, sample_logits, next_ids)
        for i, (req, tok) in enumerate(zip(reqs, next_ids, strict=True)):
            if req.finished:  # its mask or its logprobs failed
                continue
            if tok == NO_TOKEN:
                allows = bool(torch.isfinite(sample_logits[i]).any())
                self.fail(req, req.no_token_message(allows))
                continue
            self._guarded(req, "taking its next token", self._take_token, req, tok)

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

    def _verify(self, req: Req, logits: torch.Tensor) -> None:
        self._advance_grammar(req, self.structured.verify(req, logits))

    def _sample(self, reqs: list[Req], logits: torch.Tensor) -> list[int]:
        """One sample for the batch; if that raises, each row alone, so that only the rows
        that fail by themselves fail their request."""
        try:
            return sample(logits, self._sampling_batch(reqs, logits.device)).tolist()
        except Exception:  # noqa: BLE001 - find the request it came from
            logger.warning("sampling the batch failed; sampling its rows one by one", exc_info=True)
        ids = []
        for i, req in enumerate(reqs):
            try:
                ids.append(
                    int(sample(logits[i : i + 1], self._sampling_batch([req], logits.device)))
                )
            except Exception as e:  # noqa: BLE001
                self.fail(req, f"internal error while sampling: {type(e).__name__}: {e}", e)
                ids.append(NO_TOKEN)
        return ids

    def _sampling_batch(self, reqs: list[Req], device: torch.device) -> SamplingBatch:
        return SamplingBatch.build(
            [r.sampling_params for r in reqs],
            [r.generator for r in reqs],
            [r.output_ids for r in reqs],
            [r.origin_input_ids for r in reqs],
            self.vocab_size,
            device,
            eos_token_ids=sorted(self.eos_token_ids),
        )

    def _take_token(self, req: Req, tok: int) -> None:
        req.output_ids.append(tok)
        if req.grammar is not None:
            self._advance_grammar(req, tok)
        else:
            self._check_finished(req, tok)

    def _advance_grammar(self, req: Req, tok: int) -> None:
        """The matcher takes the new token (already in output_ids); unless that ends the
        request, the text the grammar now fixes is proposed at once (jump-forward)."""
        self.structured.accept(req, tok)
        if not req.finished:
            self._check_finished(req, tok)
        self.structured.propose(req)

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

    def _record_output_logprobs(
        self, reqs: list[Req], logits: torch.Tensor, next_ids: list[int]
    ) -> None:
        rows = [
            i
            for i, r in enumerate(reqs)
            if r.return_logprob and not r.finished and next_ids[i] != NO_TOKEN
        ]
        if not rows:
            return
        k = max(reqs[i].top_logprobs_num for i in rows)
        try:
            lp, top_v, top_i, every = compute_logprobs(
                logits[rows], torch.tensor(next_ids)[rows], k
            )
        except Exception as e:  # noqa: BLE001 - each request that asked fails alone
            for i in rows:
                self.fail(reqs[i], f"internal error while computing its logprobs: {e}", e)
            return
        for j, i in enumerate(rows):
            self._guarded(
                reqs[i],
                "recording its logprobs",
                self._record_output_row,
                reqs[i],
                next_ids[i],
                lp[j],
                top_v[j : j + 1],
                top_i[j : j + 1],
                every[j : j + 1],
            )

    def _record_output_row(
        self,
        req: Req,
        tok: int,
        lp: torch.Tensor,
        top_v: torch.Tensor,
        top_i: torch.Tensor,
        every: torch.Tensor,
    ) -> None:
        req.output_token_logprobs.append((float(lp), tok))
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
        detok=None if req.detok_sent else _detok_params(req.sampling_params),
        admitted_at=req.admitted_at,
        first_token_at=req.first_token_at,
    )
    req.detok_sent = True
    if want:
        req.output_token_logprobs, req.output_top_logprobs = [], []
        req.input_token_logprobs, req.input_top_logprobs = [], []
        req.output_token_ids_logprobs, req.input_token_ids_logprobs = [], []
    return out


def _detok_params(params: SamplingParams) -> DetokParams:
    return DetokParams(
        params.skip_special_tokens,
        params.spaces_between_special_tokens,
        list(params.stop or []),
        params.no_stop_trim,
        list(params.stop_regex or []),
    )
