"""The torch backend's native CPU path: the whole batch in one `radixrt::paged_attention` call.

The kernel (native/csrc/paged_attention.cpp) reads each sequence's keys in place from the pool
by slot, with a bottom-right causal mask, so decodes, short extends after a cached prefix and
prefill chunks all go through it together, with no padding and no gathered copy of a prefix.
A prefix shared by several sequences keeps the cascade of the torch path: the kernel covers each
sequence's own keys (after the shared slots) and returns their log-sum-exp, and
`radixrt::cascade_attention` runs the same tiles unmasked for those rows over the shared slots
(each slot read once per tile of up to 64 rows, not once per sequence) and merges the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixrt.attention.forward_batch import ForwardBatch


@dataclass(frozen=True)
class Cascade:
    """Batch rows whose sequences all start with `prefix_slots`, left out of their kernel keys."""

    rows: torch.Tensor  # [N] int64 rows of the batch's tokens
    prefix_slots: torch.Tensor  # [P]


@dataclass(frozen=True)
class NativePlan:
    """The kernel's view of the batch: sequence i's rows qo_indptr[i]:qo_indptr[i+1] (the
    batch's, in order) attend to kv_indices[kv_indptr[i]:kv_indptr[i+1]]."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    cascades: list[Cascade]
    window: int = 0  # > 0: each row sees only the keys of its sliding window


def plan_native(
    fb: ForwardBatch,
    skip: list[int],
    cascades: list[tuple[list[int], torch.Tensor]],
    window: int = 0,
) -> NativePlan:
    """skip[i]: leading slots of sequence i that a cascade covers instead of the kernel;
    cascades: (its sequences, its shared slots), none with a sliding `window`."""
    assert window == 0 or not cascades, "a sliding window sees no shared prefix as a whole"
    qo_starts = offsets(fb.extend_lens_cpu)
    rows = [
        Cascade(_rows(qo_starts, fb.extend_lens_cpu, ids, fb.qo_indptr.device), prefix)
        for ids, prefix in cascades
    ]
    if not any(skip):
        return NativePlan(fb.qo_indptr, fb.kv_indptr, fb.kv_indices, rows, window)
    kv_starts = offsets(fb.seq_lens_cpu)
    own = [
        fb.kv_indices[start + s : start + n]
        for start, s, n in zip(kv_starts, skip, fb.seq_lens_cpu, strict=True)
    ]
    lens = [n - s for n, s in zip(fb.seq_lens_cpu, skip, strict=True)]
    kv_indptr = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0)
    return NativePlan(fb.qo_indptr, kv_indptr.to(fb.kv_indptr.device), torch.cat(own), rows, window)


def offsets(lengths: list[int]) -> list[int]:
    """Where each of consecutive runs of these lengths starts."""
    out, total = [], 0
    for n in lengths:
        out.append(total)
        total += n
    return out


def _rows(starts: list[int], lens: list[int], ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.cat([torch.arange(starts[i], starts[i] + lens[i], device=device) for i in ids])


def native_attention(
    ops: Any,
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [pool, Hkv, D]
    v_cache: torch.Tensor,
    plan: NativePlan,
    scaling: float,
) -> torch.Tensor:  # [T, Hq, D]
    """Attention of every row of the batch: the kernel, then each cascade's shared prefix
    merged in (the native layer stack makes the same calls)."""
    out, lse = ops.paged_attention(
        q, k_cache, v_cache, plan.qo_indptr, plan.kv_indptr, plan.kv_indices, scaling, plan.window
    )
    for cascade in plan.cascades:
        ops.cascade_attention(
            q, k_cache, v_cache, cascade.rows, cascade.prefix_slots, scaling, out, lse
        )
    return out  # type: ignore[no-any-return]


def can_run_native(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """The kernel's layout and dtype requirements (else the torch path runs)."""
    return (
        q.device.type == "cpu"
        and q.dtype == k_cache.dtype == v_cache.dtype
        and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and k_cache.stride(2) == 1
        and k_cache.stride() == v_cache.stride()
        and q.shape[-1] % 2 == 0
    )
