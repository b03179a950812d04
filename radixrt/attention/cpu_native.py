"""The torch backend's native CPU path: the whole batch in one `radixrt::paged_attention` call.

The kernel (native/csrc/paged_attention.cpp) reads each sequence's keys in place from the pool
by slot, with a bottom-right causal mask, so decodes, short extends after a cached prefix and
prefill chunks all go through it together, with no padding and no gathered copy of a prefix.
A prefix shared by several sequences keeps the cascade of the torch path, in whole chunks of
KEY_CHUNK keys: the kernel runs its tiles unmasked for those rows over the shared chunks (each
slot read once per tile of up to 64 rows, not once per sequence), then each row's own keys
(after them) fold on. A row's keys are cut into chunks at the same fixed positions whatever
its batch, and the chunks' partial results fold in order, so a cascade changes no bit of what
the row would get alone (docs/determinism.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixrt.attention.forward_batch import ForwardBatch

# The kernel's chunk of keys (radixrt::attention_key_chunk, native/csrc/attention_chunks.h): a
# cascade covers whole chunks of a shared prefix, the rest stays with each row's own keys.
KEY_CHUNK = 256


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
    cascades: list[tuple[list[int], torch.Tensor]],
    window: int = 0,
) -> NativePlan:
    """cascades: (its sequences, its shared slots), none with a sliding `window`. Each cascade
    keeps the whole chunks of its prefix (KEY_CHUNK keys each), which its sequences' own keys
    then skip; the rest stays with their own keys."""
    assert window == 0 or not cascades, "a sliding window sees no shared prefix as a whole"
    skip = [0] * fb.batch_size
    whole = []
    for ids, prefix in cascades:
        n = prefix.numel() // KEY_CHUNK * KEY_CHUNK
        if n > 0:
            whole.append((ids, prefix[:n]))
        for i in ids:
            skip[i] = n
    cascades = whole
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
    """Attention of every row of the batch, each cascade's shared prefix folded in first (the
    native layer stack makes the same call)."""
    out, _ = ops.paged_attention(
        q, k_cache, v_cache, plan.qo_indptr, plan.kv_indptr, plan.kv_indices, scaling,
        plan.window, [c.rows for c in plan.cascades], [c.prefix_slots for c in plan.cascades],
    )  # fmt: skip
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
