"""Handing freed heap memory back to the system."""

from __future__ import annotations

import ctypes

_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only


def release_freed_memory() -> None:
    """Give the free pages of every malloc arena back to the system (a few ms). glibc keeps
    what a process freed mapped, and resident, for reuse, unless asked."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
