"""Triton kernels: paged decode and extend attention, fused layers (see docs/gpu.md).

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


def _hand_over_to_the_installed_kernels() -> None:
    """Replace this package in `sys.modules` by Hugging Face's `kernels`, found past the checkout.

    With the checkout's root on `sys.path` (`python -m radixrt.cli`, `python -c` or a script run
    from the root), this folder is importable as a top-level `kernels` and shadows Hugging Face's
    package of that name, which transformers (5.25 requires it) imports at start-up.
    """
    import os
    import sys
    from importlib.machinery import PathFinder

    checkout = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != checkout]
    spec = PathFinder.find_spec("kernels", others)
    if spec is None or spec.loader is None or spec.origin is None:  # none, or a namespace folder
        return
    module = importlib.util.module_from_spec(spec)
    # The import system returns what `sys.modules` holds once this file has run.
    sys.modules["kernels"] = module
    spec.loader.exec_module(module)


if __name__ == "kernels":
    _hand_over_to_the_installed_kernels()
