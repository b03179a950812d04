"""How `select` turns each choice's token logprobs into a decision (SGLang's three methods).

Every method sees, per choice, the logprobs of the choice's tokens given the text before it
(`conditional`), and for `unconditional_likelihood_normalized` also given no context at all
(`unconditional`: the choice's tokens scored alone, so the first one has none, None).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ChoicesMethod:
    name: str
    requires_unconditional_logprobs: bool = False

    def scores(
        self, conditional: list[list[float]], unconditional: list[list[float | None]] | None = None
    ) -> list[float]:
        """One score per choice; higher is better."""
        if self.name == "token_length_normalized":
            return [mean_logprob(lps) for lps in conditional]
        if self.name == "unconditional_likelihood_normalized":
            if unconditional is None:
                raise ValueError(
                    "unconditional_likelihood_normalized needs the choices' unconditional logprobs"
                )
            # As SGLang: a missing unconditional logprob (the first token's) counts as 0.
            return [
                mean_logprob([c - (u or 0.0) for c, u in zip(cond, uncond, strict=True)])
                for cond, uncond in zip(conditional, unconditional, strict=True)
            ]
        if self.name == "greedy_token_selection":
            winner = greedy_winner(conditional)
            return [1.0 if i == winner else 0.0 for i in range(len(conditional))]
        raise ValueError(f"unknown choices_method {self.name!r}")

    def __str__(self) -> str:
        return self.name


token_length_normalized = ChoicesMethod("token_length_normalized")
greedy_token_selection = ChoicesMethod("greedy_token_selection")
unconditional_likelihood_normalized = ChoicesMethod(
    "unconditional_likelihood_normalized", requires_unconditional_logprobs=True
)
METHODS = {
    m.name: m
    for m in (token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized)
}


def greedy_winner(conditional: list[list[float]]) -> int:
    """Greedy decoding restricted to the choices, as SGLang's: token position by position,
    keep the choices whose logprob there is the highest, until one is left. A choice shorter
    than the others counts its mean logprob at the positions it lacks; the first of a final
    tie wins."""
    width = max(len(c) for c in conditional)
    padded = [c + [mean_logprob(c)] * (width - len(c)) for c in conditional]
    alive = list(range(len(conditional)))
    for pos in range(width):
        best = max(padded[i][pos] for i in alive)
        alive = [i for i in alive if padded[i][pos] == best]
        if len(alive) == 1:
            break
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
