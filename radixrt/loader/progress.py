"""Progress of loading a model's weight tensors: a tqdm bar when stderr is a terminal, else
(a log file, a pipe) a log line at each quarter, which keeps the file free of bar redraws."""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs installed

logger = logging.getLogger("radixrt.loader")

LOG_EVERY_PERCENT = 25


class WeightProgress:
    def __init__(self, total: int) -> None:
        self.total = max(total, 1)
        self.done = 0
        self._next_percent = LOG_EVERY_PERCENT
        shown = logger.isEnabledFor(logging.INFO)
        self._bar = (
            tqdm(total=total, desc="loading weights", unit="tensor", file=sys.stderr, leave=False)
            if shown and sys.stderr.isatty()
            else None
        )
        self._log = shown and self._bar is None

    def advance(self) -> None:
        """One more tensor loaded."""
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            return
        percent = 100 * self.done // self.total
        if self._log and self._next_percent <= percent < 100:  # 100%: load_model's own line
            logger.info("loading weights: %d%% (%d/%d tensors)", percent, self.done, self.total)
            self._next_percent = (percent // LOG_EVERY_PERCENT + 1) * LOG_EVERY_PERCENT

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
