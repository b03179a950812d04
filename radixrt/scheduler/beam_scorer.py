"""Beam search's choices for one group, step by step, as transformers' `generate(num_beams=k,
do_sample=False)` makes them (generation/utils.py, `_beam_search`, transformers 5).

Every step the group has k running beams (at the first step, k copies of the prompt, all but
the first scored -1e9, so the first step's candidates come from the prompt once). Their
log-probabilities plus the beams' running scores are ranked over beams x vocabulary; of the top
`keep` candidates (2k, or more with several stop ids), the best k that did not stop run on, and
those among the first k that stopped (a stop id, or the length limit) compete with the
finished hypotheses kept so far, scored sum of logprobs / generated length ** length_penalty.
The same float32 operations in the same order, and torch.topk over the same layout, so ties
and the -1e9 markers fall as they do there. Knows no request, page or model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

NEG = -1.0e9  # transformers' marker for "cannot be chosen", added as a float32 term


@dataclass(frozen=True)
class Hypothesis:
    """A finished beam: its generated tokens (the stop id included) and its score."""

    tokens: list[int]
    score: float
    cum_logprob: float  # the sum of its tokens' log-probabilities (the score before the penalty)


@dataclass(frozen=True)
class StepChoice:
    """The k beams that run on: beam i continues running beam parents[i] with tokens[i]."""

    parents: list[int]
    tokens: list[int]
    # For each newly finished hypothesis this step: the running beam it extends.
    finished_parents: list[int]
    done: bool


class BeamScorer:
    def __init__(
        self,
        width: int,
        num_stop_ids: int,
        max_new_tokens: int,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
    ) -> None:
        self.width = width
        self.keep = max(2, 1 + num_stop_ids) * width
        self.max_new_tokens = max_new_tokens
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.running = torch.zeros(width, dtype=torch.float32)
        self.running[1:] = NEG
        self.scores = torch.full((width,), NEG, dtype=torch.float32)  # finished, best first
        self.hypotheses: list[list[int]] = [[] for _ in range(width)]
        self.cum_logprobs = [NEG] * width
        self.is_finished = torch.zeros(width, dtype=torch.bool)
        self.improvable = True  # transformers' is_early_stop_heuristic_unsatisfied
        self.generated = 0  # tokens every running beam holds

    def step(
        self,
        log_probs: torch.Tensor,
        beams: list[list[int]],
        stops: Callable[[list[int], int], bool],
    ) -> StepChoice:
        """One step. `log_probs` [k, V] float32: each running beam's next-token log-probs
        (after min_new_tokens' ban); `beams[i]`: running beam i's generated tokens;
        `stops(tokens, token)`: whether that continuation ends with a stop."""
        vocab = log_probs.shape[1]
        flat = (log_probs + self.running[:, None]).reshape(-1)
        top_lp, top_idx = torch.topk(flat, k=min(self.keep, flat.numel()))
        parents = (top_idx // vocab).tolist()
        tokens = (top_idx % vocab).tolist()
        at_limit = self.generated + 1 >= self.max_new_tokens
        hits = torch.tensor(
            [at_limit or stops(beams[p], t) for p, t in zip(parents, tokens, strict=True)]
        )
        runnable = top_lp + hits.to(torch.float32) * NEG
        nxt = torch.topk(runnable, k=self.width)[1].tolist()
        new_running = runnable[nxt]
        finished_parents = self._update_finished(top_lp, hits, parents, tokens, beams)
        self.running = new_running
        self.generated += 1
        self._update_improvable()
        done = not (
            self.improvable
            and not (bool(self.is_finished.all()) and self.early_stopping is True)
            and not bool(hits.all())
        )
        return StepChoice(
            [parents[i] for i in nxt], [tokens[i] for i in nxt], finished_parents, done
        )

    def _update_finished(
        self,
        top_lp: torch.Tensor,
        hits: torch.Tensor,
        parents: list[int],
        tokens: list[int],
        beams: list[list[int]],
    ) -> list[int]:
        """transformers' `_update_finished_beams`: the top-k candidates that stopped, scored
        with the length penalty, merged with the kept hypotheses; the best k stay."""
        in_top = torch.zeros(hits.numel(), dtype=torch.bool)
        in_top[: self.width] = True
        just_finished = hits & in_top
        scored = top_lp / ((self.generated + 1) ** self.length_penalty)
        full = bool(self.is_finished.all()) and self.early_stopping is True
        scored = scored + torch.tensor(float(full)) * NEG
        scored = scored + torch.tensor(float(not self.improvable)) * NEG
        scored = scored + (~just_finished) * NEG
        merged_scores = torch.cat((self.scores, scored))
        merged_finished = torch.cat((self.is_finished, just_finished))
        best = torch.topk(merged_scores, k=self.width)[1].tolist()
        hypotheses, cum = [], []
        finished_parents = []
        for i in best:
            if i < self.width:
                hypotheses.append(self.hypotheses[i])
                cum.append(self.cum_logprobs[i])
            else:
                j = i - self.width
                hypotheses.append([*beams[parents[j]], tokens[j]])
                cum.append(float(top_lp[j]))
                if bool(just_finished[j]):
                    finished_parents.append(parents[j])
        self.hypotheses, self.cum_logprobs = hypotheses, cum
        self.scores = merged_scores[best]
        self.is_finished = merged_finished[best]
        return finished_parents

    def _update_improvable(self) -> None:
        """transformers' `_check_early_stop_heuristic`: can a running beam still beat the
        worst finished hypothesis?"""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            length = self.max_new_tokens
        else:
            length = self.generated
        best_possible = self.running[:1] / (length**self.length_penalty)
        worst = torch.where(self.is_finished, self.scores.min(), torch.tensor(NEG))
        self.improvable = self.improvable and bool((best_possible > worst).any())

    def results(self, n: int) -> list[Hypothesis]:
        """The n best finished hypotheses, best first (as transformers returns them)."""
        return [
            Hypothesis(self.hypotheses[i], float(self.scores[i]), self.cum_logprobs[i])
            for i in range(n)
        ]
