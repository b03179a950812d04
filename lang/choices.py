"""How `select` turns each choice's token logprobs into a decision (SGLang's three methods).

Every method sees, per choice, the logprobs of the choice's tokens given the text before it
(`conditional`), and for `unconditional_likelihood_normalized` also given almost no context
(`unconditional`: after only the last token before the choice).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ChoicesMethod:
    name: str
    requires_unconditional_logprobs: bool = False

    def scores(self, conditional: list[list[float]],
               unconditional: list[list[float]] | None = None) -> list[float]:
        """One score per choice; higher is better."""
        if self.name == "token_length_normalized":
            return [mean_logprob(lps) for lps in conditional]
        if self.name == "unconditional_likelihood_normalized":
            if unconditional is None:
                raise ValueError("unconditional_likelihood_normalized needs the choices' "
                                 "unconditional logprobs")
            return [mean_logprob([c - u for c, u in zip(cond, uncond)])
                    for cond, uncond in zip(conditional, unconditional)]
        if self.name == "greedy_token_selection":
            winner = greedy_winner(conditional)
            return [1.0 if i == winner else 0.0 for i in range(len(conditional))]
        raise ValueError(f"unknown choices_method {self.name!r}")

    def __str__(self) -> str:
        return self.name


token_length_normalized = ChoicesMethod("token_length_normalized")
greedy_token_selection = ChoicesMethod("greedy_token_selection")
unconditional_likelihood_normalized = ChoicesMethod("unconditional_likelihood_normalized",
                                                    requires_unconditional_logprobs=True)
METHODS = {m.name: m for m in (token_length_normalized, greedy_token_selection,
                               unconditional_likelihood_normalized)}


def greedy_winner(conditional: list[list[float]]) -> int:
    """The choice that greedy decoding restricted to the choices would produce: at each token
    position keep only the choices whose token there is the most likely; ties go on to the
    next position, and among choices that end in a tie the first one wins."""
    alive = list(range(len(conditional)))
    for pos in range(max(len(c) for c in conditional)):
        longer = [i for i in alive if len(conditional[i]) > pos]
        if len(alive) == 1 or not longer:
            break
        best = max(conditional[i][pos] for i in longer)
        alive = [i for i in longer if conditional[i][pos] == best]
    return alive[0]


def decide(scores: list[float], temperature: float, rng: random.Random | None = None) -> int:
    """argmax at temperature 0, else a draw from softmax(scores / temperature)."""
    if temperature <= 0:
        return max(range(len(scores)), key=lambda i: scores[i])
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    return (rng or random).choices(range(len(scores)), weights=weights)[0]


def mean_logprob(values: list[float]) -> float:
    return sum(values) / len(values) if values else -math.inf
