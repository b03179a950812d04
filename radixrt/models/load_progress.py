"""Progress of loading a model's weight tensors: a log line at each quarter, in the one log
format (a terminal and a log file read the same; a progress bar's redraws would litter the
file and interleave with the other processes' lines)."""

from __future__ import annotations

import logging

logger = logging.getLogger("radixrt.loader")

LOG_EVERY_PERCENT = 25


class WeightProgress:
    def __init__(self, total: int) -> None:
        self.total = max(total, 1)
        self.done = 0
        self._next_percent = LOG_EVERY_PERCENT

    def advance(self) -> None:
        """One more tensor loaded."""
        self.done += 1
        percent = 100 * self.done // self.total
        if self._next_percent <= percent < 100:  # 100%: load_model's own line
            logger.info("loading weights: %d%% (%d/%d tensors)", percent, self.done, self.total)
            self._next_percent = (percent // LOG_EVERY_PERCENT + 1) * LOG_EVERY_PERCENT
