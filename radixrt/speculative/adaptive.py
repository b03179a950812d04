"""How many drafted tokens are worth verifying: per request, by its acceptance so far; per
step, by what an extra token costs the forward at the batch's size.

Acceptance. Draft position i is accepted only if positions 0..i-1 were, so each verified
draft is a run of trials: the accepted positions are successes, the first rejected one a
failure, the rest untested. From one verification that kept k drafts the chance that one more
drafted token is kept is estimated as k / (k + 1) if a draft was rejected, (k + 1) / (k + 2)
if none was; `Acceptance.rate` is a moving average of these estimates, one per verification.
Weighing verifications alike (not their tokens: a copied run of 11 would outweigh the next
ten failures) makes the rate follow the text: a request that stops copying drafts shallow
within two or three steps. A request that does not draft still scores the draft it would have
made against the token the model then picked (a free trial), so its rate recovers when its
text starts repeating. A new request starts from the server's rates, a slower average over
every request's verifications: requests alike (one application's traffic) start at the depth
the ones before them found. The scheduler keeps two rates per request, for drafts from a long match
and from a short one (speculation.py): a tail of one or two tokens that occurred before is
weaker evidence than a tail of ten.

Cost. A step's forward time is fitted as T(n) = a + b n over its n query tokens, from the
steps just run (decodes and verifications; prefill chunks are left out). One more drafted
token costs b; a step of B one-token decodes costs a + b B for B tokens. Draft token i of a
request pays off when its chance rate^i of being kept is worth more than it costs:
rate^i * (a + b B) / B > b. At batch 1 on a CPU a decode reads every weight for one token (a
is large, b small) and drafts go deep; at a large, compute-bound batch few drafts pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The weight of each verification's estimate in a request's moving average, and in the
# server's (the rates a new request starts from: those of the requests before it).
ACCEPTANCE_WEIGHT, SERVER_WEIGHT = 0.5, 0.05
# Before any trial: a third of the drafted tokens kept (short first drafts: text that does not
# repeat costs little, text that does earns depth in a few steps).
PRIOR_RATE = 0.3
# The cost fit's prior, as pseudo-steps: one more token costs PRIOR_TOKEN_COST of a one-token
# step (measured on the CPU: a 2,000-token prefill runs ~15x the tokens per second of a
# batch-1 decode), worth PRIOR_STEPS steps.
PRIOR_TOKEN_COST, PRIOR_STEPS = 0.07, 4.0
COST_DECAY = 0.98  # per step: the last ~50 steps fit the cost


@dataclass
class Acceptance:
    """The chance that one more drafted token of a request is kept (see the module's doc)."""

    rate: float = PRIOR_RATE
    weight: float = ACCEPTANCE_WEIGHT

    def record(self, drafted: int, kept: int) -> None:
        """A verification of `drafted` tokens kept the first `kept` of them."""
        if drafted <= 0:
            return
        estimate = kept / (kept + 1) if kept < drafted else (kept + 1) / (kept + 2)
        self.rate += self.weight * (estimate - self.rate)


class StepCost:
    """T(n) = a + b n fitted by decayed least squares over recent steps, from a prior."""

    def __init__(self) -> None:
        # Sums of weight, n, T, n^2, n T over the steps (decayed) and over the prior's two
        # pseudo-steps (kept: steps that all have one size say nothing of the slope). The prior
        # goes in with the first real step, in its unit of time (seconds on this machine).
        self._steps = [0.0] * 5
        self._prior = [0.0] * 5

    def record(self, tokens: int, seconds: float) -> None:
        """A forward of `tokens` query tokens (decodes and drafts) took `seconds`."""
        if self._prior[0] == 0.0:
            unit = seconds / (1.0 + PRIOR_TOKEN_COST * (tokens - 1))
            for n in (1.0, 11.0):
                _add(self._prior, n, unit * (1.0 + PRIOR_TOKEN_COST * (n - 1)), PRIOR_STEPS / 2)
        self._steps = [v * COST_DECAY for v in self._steps]
        _add(self._steps, float(tokens), seconds, 1.0)

    def fit(self) -> tuple[float, float]:
        """(a, b) of T(n) = a + b n, with a > 0 and b >= 0."""
        if self._prior[0] == 0.0:
            return 1.0 - PRIOR_TOKEN_COST, PRIOR_TOKEN_COST
        w, sn, st, snn, snt = (p + s for p, s in zip(self._prior, self._steps, strict=True))
        b = max((w * snt - sn * st) / (w * snn - sn * sn), 0.0)
        a = max((st - b * sn) / w, 1e-9)
        return a, b

    def threshold(self, batch: int) -> float:
        """The least chance of being kept that makes one more drafted token worth its cost,
        in a step of `batch` requests."""
        a, b = self.fit()
        batch = max(batch, 1)
        return min(b * batch / (a + b * batch), 1.0)


def _add(sums: list[float], n: float, t: float, weight: float) -> None:
    for i, v in enumerate((1.0, n, t, n * n, n * t)):
        sums[i] += weight * v


def draft_length(rate: float, threshold: float, limit: int) -> int:
    """The most draft tokens i (up to `limit`) whose chance rate^i of being kept passes
    `threshold`."""
    if limit <= 0 or rate <= threshold or rate <= 0.0:
        return 0
    if rate >= 1.0 or threshold <= 0.0:
        return limit
    return min(limit, int(math.log(threshold) / math.log(rate)))
