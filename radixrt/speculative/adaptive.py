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

Cost. A step's forward time is fitted as T(n) = a + b n + j [drafts] over its n query tokens,
from the steps just run (decodes and verifications; prefill chunks are left out): j is what a
step pays once for verifying at all (its attention runs the extend tiles instead of the decode
ones: on the AVX-512 Xeon of docs/speculative.md a second position costs a batch-1 step about
40%, each one after it about 10%). One more drafted token costs b; a step of B one-token
decodes costs a + b B for B tokens. Draft token i of a request pays off when its chance
rate^i of being kept is worth more than it costs: rate^i * (a + b B) / B > b; and the draft as a
whole must pay for the jump too: sum_i rate^i * (a + b B) / B > j + b k for its k tokens. At
batch 1 on a CPU a decode reads every weight for one token (a is large, b small) and drafts go
deep; at a large, compute-bound batch few drafts pass; a weak draft of one or two tokens does
not pay for the jump.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

# The weight of each verification's estimate in a request's moving average, and in the
# server's (the rates a new request starts from: those of the requests before it).
ACCEPTANCE_WEIGHT, SERVER_WEIGHT = 0.5, 0.05
# Before any trial: a third of the drafted tokens kept (short first drafts: text that does not
# repeat costs little, text that does earns depth in a few steps).
PRIOR_RATE = 0.3
# The cost fit's prior, as pseudo-steps: one more token costs PRIOR_TOKEN_COST of a one-token
# step (measured on the CPU: a 2,000-token prefill runs ~15x the tokens per second of a
# batch-1 decode), verifying at all PRIOR_JUMP (below the Xeon's 0.15-0.3 at 800 keys, so
# that a new server's first weak drafts are still tried and the jump measured), worth
# PRIOR_STEPS steps.
PRIOR_TOKEN_COST, PRIOR_JUMP, PRIOR_STEPS = 0.07, 0.1, 4.0
COST_DECAY = 0.98  # per step: the last ~50 steps fit the cost
OUTLIER = 3.0  # a step counts as at most this many times what the fit expects of it


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


class Fit(NamedTuple):
    a: float  # a step's fixed cost
    b: float  # per query token
    jump: float  # once for a step that verifies drafts


class StepCost:
    """T(n) = a + b n + jump [drafts], fitted by decayed least squares over recent steps, from
    a prior."""

    def __init__(self) -> None:
        # Decayed sums of x x^T and x T over the steps, x = (1, n, drafted). The prior's three
        # pseudo-steps are added at each fit, in units of the fastest step seen (normalized by
        # the prior's own shape): a step's first run pays one-time costs (oneDNN builds its
        # kernels for each new row count), and a prior scaled by such a step would set the
        # jump so high that no draft is made, and so measured, again.
        self._steps = [[0.0] * 4 for _ in range(3)]
        self._unit = math.inf
        self._fit: Fit | None = None  # solved once per step, read once per request

    def record(self, tokens: int, seconds: float, drafted: bool | None = None) -> None:
        """A forward of `tokens` query tokens (decodes and drafts) took `seconds`; `drafted`:
        whether it verified drafts (by default: whether it had more than one token)."""
        drafted = tokens > 1 if drafted is None else drafted
        if self._unit < math.inf:  # an outlier counts as at most OUTLIER times the fit's
            a, b, jump = self.fit()
            seconds = min(seconds, OUTLIER * (a + b * tokens + (jump if drafted else 0.0)))
        self._unit = min(self._unit, seconds / _prior_time(tokens, drafted))
        self._steps = [[v * COST_DECAY for v in row] for row in self._steps]
        _add(self._steps, tokens, drafted, seconds, 1.0)
        self._fit = None

    def fit(self) -> Fit:
        """(a, b, jump), with a > 0 and b, jump >= 0."""
        if self._unit == math.inf:
            return Fit(1.0 - PRIOR_TOKEN_COST, PRIOR_TOKEN_COST, PRIOR_JUMP)
        if self._fit is None:
            sums = [row[:] for row in self._steps]
            for n, d in ((1, False), (2, True), (11, True)):
                _add(sums, n, d, self._unit * _prior_time(n, d), PRIOR_STEPS / 3)
            a, b, jump = _solve3(sums)
            self._fit = Fit(max(a, 1e-9), max(b, 0.0), max(jump, 0.0))
        return self._fit

    def threshold(self, batch: int) -> float:
        """The least chance of being kept that makes one more drafted token worth its cost,
        in a step of `batch` requests."""
        a, b, _ = self.fit()
        batch = max(batch, 1)
        return min(b * batch / (a + b * batch), 1.0)

    def pays(self, rate: float, tokens: int, batch: int) -> bool:
        """Whether a draft of `tokens` tokens, each kept with chance rate^i, is worth the
        step's cost of verifying at all as well as its tokens' (in a step of `batch`)."""
        a, b, jump = self.fit()
        batch = max(batch, 1)
        kept = sum(rate**i for i in range(1, tokens + 1))
        return kept * (a + b * batch) / batch > jump + b * tokens


def _prior_time(tokens: int, drafted: bool) -> float:
    """The prior's step time in units of a one-token decode."""
    return 1.0 + PRIOR_TOKEN_COST * (tokens - 1) + (PRIOR_JUMP if drafted else 0.0)


def _add(sums: list[list[float]], n: float, drafted: bool, t: float, weight: float) -> None:
    """Add weight * (x x^T | x t) for x = (1, n, drafted) to the normal equations."""
    x = (1.0, float(n), 1.0 if drafted else 0.0)
    for i in range(3):
        for j in range(3):
            sums[i][j] += weight * x[i] * x[j]
        sums[i][3] += weight * x[i] * t


def _solve3(m: list[list[float]]) -> tuple[float, float, float]:
    """The 3x3 system [A | y] by Cramer's rule (plain floats: a step's fit in microseconds;
    the prior keeps A well conditioned)."""

    def det(c: list[list[float]]) -> float:
        return (
            c[0][0] * (c[1][1] * c[2][2] - c[1][2] * c[2][1])
            - c[0][1] * (c[1][0] * c[2][2] - c[1][2] * c[2][0])
            + c[0][2] * (c[1][0] * c[2][1] - c[1][1] * c[2][0])
        )

    a = [row[:3] for row in m]
    d = det(a)
    return tuple(  # type: ignore[return-value]
        det([[m[i][3] if j == k else a[i][j] for j in range(3)] for i in range(3)]) / d
        for k in range(3)
    )


def draft_length(rate: float, threshold: float, limit: int) -> int:
    """The most draft tokens i (up to `limit`) whose chance rate^i of being kept passes
    `threshold`."""
    if limit <= 0 or rate <= threshold or rate <= 0.0:
        return 0
    if rate >= 1.0 or threshold <= 0.0:
        return limit
    return min(limit, int(math.log(threshold) / math.log(rate)))


def draft_size(cost: StepCost, rate: float, limit: int, batch: int) -> int:
    """How many of a draft's `limit` tokens to verify, for a request whose drafts are kept at
    `rate`, in a step of `batch` requests: draft_length's count if the draft pays for the jump
    too, else none."""
    tokens = draft_length(rate, cost.threshold(batch), limit)
    return tokens if tokens and cost.pays(rate, tokens, batch) else 0
