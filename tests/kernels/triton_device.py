"""Where the Triton kernel tests run: on CPU tensors under Triton's interpreter (the default,
set by this folder's conftest), or on CUDA tensors compiled (`TRITON_INTERPRET=0`)."""

from __future__ import annotations

import os

import pytest
import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
KERNEL_DEVICE = "cpu" if INTERPRETING else "cuda"

# The Triton tests' marks: `pytest -m gpu` selects them; compiled Triton needs CUDA tensors.
KERNEL_DEVICE_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not INTERPRETING and not torch.cuda.is_available(),
        reason="TRITON_INTERPRET=0 needs a CUDA device; on the CPU run under the interpreter",
    ),
]


def on_kernel_device(test):
    """Decorator: KERNEL_DEVICE_MARKS on one test."""
    for mark in KERNEL_DEVICE_MARKS:
        test = mark(test)
    return test


# Tests of Triton on CPU tensors (the interpreter's own cases).
interpreter_only = pytest.mark.skipif(
    not INTERPRETING, reason="runs Triton on CPU tensors: needs TRITON_INTERPRET=1"
)
