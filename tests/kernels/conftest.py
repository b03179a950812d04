"""Kernel tests run on the CPU under Triton's interpreter (set here before triton is imported),
or compiled on a GPU: `TRITON_INTERPRET=0 pytest -m gpu tests/kernels` (scripts/gpu_check.sh).
The Triton tests are marked `gpu` and put their tensors on `KERNEL_DEVICE`: "cpu" under the
interpreter, else "cuda" (skipped where there is none).

`paged_kv(specs, ...)` builds a ragged batch whose K/V lie scattered in a paged pool, the way
the engine lays them out (page p owns slots p*page_size..; a sequence's pages in random order).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from triton_device import KERNEL_DEVICE  # noqa: E402


@dataclass
class PagedKV:
    k_buffer: torch.Tensor  # [pool, Hkv, D]
    v_buffer: torch.Tensor
    qo_indptr: torch.Tensor  # [B+1]
    kv_indptr: torch.Tensor  # [B+1]
    kv_indices: torch.Tensor  # [sum(L)]
    q: torch.Tensor  # [T, Hq, D], one row per new token
    max_new_tokens: int


def _slots(specs: list[tuple[int, int]], page_size: int, gen: torch.Generator) -> list[list[int]]:
    """Each sequence's slots, position order, on its own pages taken from a shuffled pool."""
    pages_needed = [-(-(p + n) // page_size) for p, n in specs]
    order = torch.randperm(sum(pages_needed) + 3, generator=gen).tolist()
    out, used = [], 0
    for (p, n), count in zip(specs, pages_needed, strict=True):
        pages = order[used : used + count]
        used += count
        out.append([pg * page_size + j for pg in pages for j in range(page_size)][: p + n])
    return out


@pytest.fixture
def paged_kv() -> Callable[..., PagedKV]:
    """Factory `(specs, hq, hkv, head_dim, page_size, dtype, seed=0, device=None) -> PagedKV`,
    on KERNEL_DEVICE unless `device` is given; specs are (prefix_len, new_len) per sequence;
    the pool is filled with random K/V everywhere."""

    def make(specs, hq, hkv, head_dim, page_size, dtype=torch.float32, seed=0, device=None):
        device = device or KERNEL_DEVICE
        gen = torch.Generator().manual_seed(seed)
        slots = _slots(specs, page_size, gen)
        pool = (max(max(s) for s in slots if s) + 1 + page_size) if any(slots) else page_size

        def randn(*shape):
            return torch.randn(*shape, generator=gen).to(dtype).to(device)

        def indptr(lengths):
            return torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(device)

        news = [n for _, n in specs]
        return PagedKV(
            k_buffer=randn(pool, hkv, head_dim),
            v_buffer=randn(pool, hkv, head_dim),
            qo_indptr=indptr(news),
            kv_indptr=indptr([p + n for p, n in specs]),
            kv_indices=torch.tensor(sum(slots, []), dtype=torch.int64, device=device),
            q=randn(sum(news), hq, head_dim),
            max_new_tokens=max(news, default=0),
        )

    return make
