"""The one log format of every radixrt process, and the one place that sets it up.

    [2026-12-01 18:00:00 scheduler] INFO radixrt.scheduler.components: KV pool: ...

The bracket names the process's role (frontend: the HTTP server or the Engine's caller;
scheduler; detokenizer), since the three write to the same terminal or file. uvicorn's own
loggers get the same format through `uvicorn_log_config`, which is the same dictConfig.
Torch-free: the HTTP process imports it.
"""

from __future__ import annotations

import logging.config
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def log_format(role: str) -> str:
    return f"[%(asctime)s {role}] %(levelname)s %(name)s: %(message)s"


def logging_config(role: str, level: str) -> dict[str, Any]:
    """A logging.config.dictConfig dict: the root logger writes to stderr in the format,
    at `level` (one of LEVELS); uvicorn's loggers pass their records up to it."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log_level must be one of {list(LEVELS)}, got {level!r}")
    formatter = {"format": log_format(role), "datefmt": DATE_FORMAT}
    return {
        "version": 1,
        # Loggers created at import (radixrt.*) must keep working after uvicorn re-applies it.
        "disable_existing_loggers": False,
        # uvicorn sets use_colors on the formatters named "default" and "access" when asked.
        "formatters": {"default": formatter, "access": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        # uvicorn's defaults give these handlers of their own; here they only propagate.
        "loggers": {
            name: {"level": level.upper(), "handlers": [], "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def configure_logging(role: str, level: str) -> None:
    """Set up this process's logging (replacing any earlier set-up)."""
    logging.config.dictConfig(logging_config(role, level))


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn.Config's log_config: the frontend's own set-up, which uvicorn re-applies."""
    return logging_config("frontend", level)


def format_bytes(n: float) -> str:
    """`n` bytes in GiB, or in MiB below one GiB (a tiny model's 0.00 GiB says nothing)."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def configure_default_logging(role: str, level: str) -> None:
    """As logging.basicConfig: set up the format only when nothing has set up logging yet (an
    application that uses Engine keeps its own handlers)."""
    if not logging.getLogger().handlers:
        configure_logging(role, level)
