"""Triton kernels: paged decode and extend attention, fused layers (see README, "Triton kernels").

The kernel modules import triton; this package and `reference` do not, so that importing
radixrt never needs it.
"""

from __future__ import annotations

import functools
import importlib.util


@functools.cache
def has_triton() -> bool:
    """Whether triton is installed (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None
