"""Pick the next token of every request in a batch, with batched tensor ops.

Per step the scheduler builds one `SamplingBatch` from its requests and calls `sample` on the
last-position logits. Order: penalties (on a copy) → greedy rows take the argmax → the others
are divided by their temperature, softmaxed, filtered by top-k, then top-p, then min-p, and drawn.

Drawing uses the exponential race: with E_i ~ Exp(1) independent, argmax_i(p_i / E_i) is
distributed exactly as p. The noise of a row with its own `torch.Generator` (a request with a
seed) is drawn from that generator alone, so a seeded request draws the same tokens whatever
else shares its batch. Rows without one draw from torch's default generator, in one call.

A large vocabulary (Gemma 3's 262,144) makes a sort of every row the cost of a step: 21 ms at
batch 1, twice the model's decode. So where the filters keep few tokens (top-k up to
CANDIDATES, or top-p / min-p whose kept mass ends within the top CANDIDATES), a row draws
among its top CANDIDATES only (`torch.topk`, 0.9 ms): the kept tokens, hence the
distribution, are the same; else its whole row is sorted. Each row decides by its own
parameters and logits, so a seeded row's tokens still do not depend on its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixrt.executor.penalties import PenaltyState, build_penalties
from radixrt.protocol.sampling_params import SamplingParams


@dataclass
class SamplingBatch:
    """The sampling parameters of a batch of B requests as tensors, plus what to skip."""

    temperatures: torch.Tensor  # [B, 1] float32, 1.0 on greedy rows (never divides by 0)
    top_ps: torch.Tensor  # [B] float32
    top_ks: torch.Tensor  # [B] int64, vocab_size where top-k is off
    min_ps: torch.Tensor  # [B] float32
    greedy: torch.Tensor  # [B] bool
    generators: list[torch.Generator | None]  # per row; None = torch's default generator
    all_greedy: bool
    need_top_p: bool
    need_top_k: bool
    need_min_p: bool
    penalties: PenaltyState | None  # None when no request uses a penalty

    @property
    def batch_size(self) -> int:
        return len(self.generators)

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        output_ids: Sequence[Sequence[int]],
        prompt_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device | str,
        eos_token_ids: Sequence[int] = (),
    ) -> SamplingBatch:
        """Build the batch of one step; `params` must already be verified.

        generators[i] must live on `device` (it draws row i's noise there). `eos_token_ids`
        are masked, with each request's stop_token_ids, until it reaches min_new_tokens.
        """
        assert len(params) == len(generators) == len(output_ids) == len(prompt_ids)
        greedy = [p.is_greedy for p in params]
        sampled = [p for p, g in zip(params, greedy, strict=True) if not g]
        top_ks = [vocab_size if p.top_k < 1 else min(p.top_k, vocab_size) for p in params]
        return cls(
            temperatures=_floats(
                [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)], device
            ).unsqueeze(1),
            top_ps=_floats([p.top_p for p in params], device),
            top_ks=torch.tensor(top_ks, dtype=torch.int64, device=device),
            min_ps=_floats([p.min_p for p in params], device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            generators=list(generators),
            all_greedy=all(greedy),
            need_top_p=any(p.top_p < 1.0 for p in sampled),
            need_top_k=any(0 < p.top_k < vocab_size for p in sampled),
            need_min_p=any(p.min_p > 0.0 for p in sampled),
            penalties=build_penalties(
                params, output_ids, prompt_ids, vocab_size, device, eos_token_ids
            ),
        )


def _floats(values: list[float], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


NO_TOKEN = -1  # the id `sample` gives a row where nothing can be drawn
CANDIDATES = 1024  # tokens a filtered row draws among when its kept tokens are all in them


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Next token ids [B] int64 from the last-position logits [B, V] float32.

    A row where no token is left to draw (every logit -inf after the grammar's mask and the
    penalties: say min_new_tokens bans the end of sequence, the only token a finished grammar
    allows), or one with a NaN logit, gets NO_TOKEN; the caller ends that request. The
    caller's logits are never modified (penalties work on a copy).
    """
    assert logits.dim() == 2 and logits.shape[0] == batch.batch_size, logits.shape
    logits = logits.to(torch.float32)
    if batch.penalties is not None:
        logits = logits.clone()
        batch.penalties.apply(logits)
    greedy_ids = logits.argmax(dim=-1)
    if batch.all_greedy:
        return _mark_empty_rows(greedy_ids, logits, greedy_ids)
    probs = torch.softmax(logits / batch.temperatures, dim=-1)  # [B, V]
    # Each row is drawn among its candidates or over its whole row by its own parameters and
    # logits alone, so a seeded row draws the same tokens whatever else shares its batch.
    candidates = filtered_candidates(probs, batch)
    covered = [False] * batch.batch_size if candidates is None else candidates[2].tolist()
    sampled = (~batch.greedy).tolist()
    near = [i for i in range(batch.batch_size) if sampled[i] and covered[i]]
    whole = [i for i in range(batch.batch_size) if sampled[i] and not covered[i]]
    ids = greedy_ids.clone()
    seeded = _seeded_noise(batch, near, whole, probs.shape[-1], probs.device)
    if candidates is not None and near:
        values, tokens = candidates[0][near], candidates[1][near]
        noise = _exponential_noise(values, batch, near, seeded)
        ids[near] = tokens.gather(1, (values / noise).argmax(dim=-1, keepdim=True)).squeeze(1)
    if whole:
        kept = filter_probs(probs[whole], batch, whole)
        ids[whole] = (kept / _exponential_noise(kept, batch, whole, seeded)).argmax(dim=-1)
    return _mark_empty_rows(ids, logits, greedy_ids)


def filtered_candidates(
    probs: torch.Tensor, batch: SamplingBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Each row's top CANDIDATES probabilities, those filter_probs drops zeroed, their token
    ids ([B, K] each), and [B] bool: whether the row keeps only tokens among them (see the
    module's docstring). None where no filter is asked for or the vocabulary is small."""
    vocab = probs.shape[-1]
    if vocab <= CANDIDATES or not (batch.need_top_k or batch.need_top_p or batch.need_min_p):
        return None
    values, ids = probs.topk(CANDIDATES, dim=-1)  # [B, K] each, descending
    top_k = batch.top_ks.unsqueeze(1)
    values.masked_fill_(torch.arange(CANDIDATES, device=probs.device) >= top_k, 0.0)
    cumulative = values.cumsum(dim=-1)
    # The top-k survivors' mass, as filter_probs takes it: all of it is among the candidates
    # where top-k keeps at most CANDIDATES, and is the whole row's where top-k is off.
    total = torch.where(top_k <= CANDIDATES, cumulative[:, -1:], probs.sum(-1, keepdim=True))
    limit = batch.top_ps.unsqueeze(1) * total
    top_p = (batch.top_ps < 1.0).unsqueeze(1)
    values.masked_fill_(((cumulative - values) > limit) & top_p, 0.0)
    threshold = batch.min_ps.unsqueeze(1) * values[:, :1]
    values.masked_fill_(values < threshold, 0.0)
    # A row's tokens past the candidates are all dropped: by its top-k, by top-p (the mass
    # before them is already past the limit) or by min-p (they are below the last candidate).
    # (Where top-k keeps more than the candidates but not all, `total` is not known here.)
    top_k_off = top_k >= vocab
    dropped_after = (top_k <= CANDIDATES) | (
        top_k_off
        & (
            (top_p & (cumulative[:, -1:] > limit))
            | (values[:, -1:] < threshold)  # a candidate dropped by min-p: so is all after it
        )
    )
    return values, ids, dropped_after.squeeze(1)


def _mark_empty_rows(ids: torch.Tensor, logits: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """ids, with NO_TOKEN in the rows of logits [B, V] that are -inf throughout or hold a NaN
    (the argmax there is an arbitrary token, one the grammar would refuse). Read from the
    value at each row's argmax, which is NaN when the row has one: a comparison over the
    whole [B, V] cost more than the LM head at batch 1."""
    best = logits.gather(1, argmax.unsqueeze(1)).squeeze(1)
    return torch.where(best > float("-inf"), ids, torch.full_like(ids, NO_TOKEN))


def filter_probs(
    probs: torch.Tensor, batch: SamplingBatch, rows: list[int] | None = None
) -> torch.Tensor:
    """Zero the probabilities top-k, top-p and min-p remove; rows are left unnormalized.
    `rows`: the batch's rows that probs holds (default: all of them, in order).

    The exponential race does not need normalized rows, so nothing is renormalized here.
    """
    index = slice(None) if rows is None else rows
    if batch.need_top_k or batch.need_top_p:
        probs = _top_k_top_p(probs, batch, batch.top_ks[index], batch.top_ps[index])
    if batch.need_min_p:
        # The top token always survives top-k/top-p, so this max is the unfiltered max.
        threshold = batch.min_ps[index].unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def _top_k_top_p(
    probs: torch.Tensor, batch: SamplingBatch, top_ks: torch.Tensor, top_ps: torch.Tensor
) -> torch.Tensor:
    # One descending sort for the whole batch serves both filters.
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [B, V] each
    if batch.need_top_k:
        ranks = torch.arange(probs.shape[-1], device=probs.device).unsqueeze(0)  # [1, V]
        sorted_probs.masked_fill_(ranks >= top_ks.unsqueeze(1), 0.0)
    if batch.need_top_p:
        # Top-p acts on the top-k survivors renormalized (as Hugging Face and vLLM do): keep a
        # token while the mass ranked above it is within top_p of the surviving mass.
        cumulative = sorted_probs.cumsum(dim=-1)  # [B, V]
        mass_before = cumulative - sorted_probs
        limit = top_ps.unsqueeze(1) * cumulative[:, -1:]  # [B, 1]
        drop = (mass_before > limit) & (top_ps < 1.0).unsqueeze(1)
        sorted_probs.masked_fill_(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def _seeded_noise(
    batch: SamplingBatch, near: list[int], whole: list[int], vocab: int, device: torch.device
) -> dict[int, torch.Tensor]:
    """Each seeded row's Exp(1) noise (CANDIDATES values for a row drawn among its
    candidates, `vocab` for a whole row), drawn from its generator in row order: rows that
    share a generator (a request's draft rows, scheduler/draft_rows.py) draw as the same rows
    would in consecutive steps."""
    size = dict.fromkeys(near, CANDIDATES) | dict.fromkeys(whole, vocab)
    noise = {}
    for row in sorted(size):
        generator = batch.generators[row]
        if generator is not None:
            noise[row] = torch.empty(size[row], device=device).exponential_(generator=generator)
    return noise


def _exponential_noise(
    probs: torch.Tensor, batch: SamplingBatch, rows: list[int], seeded: dict[int, torch.Tensor]
) -> torch.Tensor:
    """Exp(1) noise shaped as probs [R, N], whose row j is the batch's row rows[j]: a seeded
    row's from `seeded`, the others from torch's default generator (all in one call)."""
    noise = torch.empty_like(probs)
    n, device = probs.shape[-1], probs.device
    unseeded = [j for j, row in enumerate(rows) if row not in seeded]
    if unseeded:
        noise[unseeded] = torch.empty(len(unseeded), n, device=device).exponential_()
    for j, row in enumerate(rows):
        if row in seeded:
            noise[j] = seeded[row]
    # An exact 0 draw would make p / 0 = inf (or nan for p = 0); clamp it away.
    return noise.clamp_min_(torch.finfo(noise.dtype).tiny)
