"""A fixed-bucket histogram for processes that cannot reach prometheus_client's registry.

The scheduler process counts into these and ships plain snapshots inside get_stats()'s dict
(lists of ints and floats: msgspec encodes them); the frontend's collector turns them into
Prometheus histograms at scrape time. An observation is one bisect and two additions: cheap
enough for every step and every cache node touched.
"""

from __future__ import annotations

import bisect
from typing import Any


class FixedHistogram:
    """Counts per bucket (upper bounds `bounds`, then +Inf) and the sum of the values."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        assert list(bounds) == sorted(set(bounds)), f"bucket bounds must increase: {bounds}"
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value` (a node of several pages counts once per page)."""
        # bisect_left: a value equal to a bound belongs to that bucket (Prometheus' `le`).
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count

    @property
    def total(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> dict[str, Any]:
        """{"bounds", "counts" (per bucket, not cumulative; the last is +Inf), "sum"}."""
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum}
