"""Plain-torch references for every Triton kernel in this package: slow, obvious, float32.

The kernel tests compare against these; `scripts/bench_kernels.py` runs the same checks on a GPU.
The fused-layer references repeat the rounding order of the model's torch path
(`radixrt.layers`), so that a kernel matching them matches the model bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_ref(
    q: torch.Tensor,  # [T, Hq, D]: the new tokens of every sequence, sequence after sequence
    k_buffer: torch.Tensor,  # [pool, Hkv, D]
    v_buffer: torch.Tensor,  # [pool, Hkv, D]
    qo_indptr: torch.Tensor,  # [B+1] offsets of each sequence's new tokens in q
    kv_indptr: torch.Tensor,  # [B+1] offsets of each sequence's slots in kv_indices
    kv_indices: torch.Tensor,  # [sum(L)] pool slots of every token of each sequence, in order
    scaling: float,
    window: int = 0,
) -> torch.Tensor:  # [T, Hq, D] in q.dtype
    """Causal attention of each sequence's n new tokens (its last n positions) over all of its
    L keys (prefix L - n, then the new tokens). Decode is the case n = 1. With window W > 0 a
    token at position p sees only the keys at positions p - W + 1 .. p."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_buffer.shape[1]
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        k = k_buffer[slots].float().repeat_interleave(group, 1)  # [L, Hq, D]
        v = v_buffer[slots].float().repeat_interleave(group, 1)
        n, total = q1 - q0, slots.numel()
        scores = torch.einsum("nhd,lhd->hnl", q[q0:q1].float(), k) * scaling
        q_pos = torch.arange(total - n, total, device=q.device)
        key_pos = torch.arange(total, device=q.device)[None, :]
        visible = key_pos <= q_pos[:, None]  # [n, L]
        if window > 0:
            visible &= key_pos > q_pos[:, None] - window
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[q0:q1] = torch.einsum("hnl,lhd->nhd", probs, v).to(q.dtype)
    return out


def decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D], one new token per sequence
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,  # [B+1]
    kv_indices: torch.Tensor,
    scaling: float,
    window: int = 0,
) -> torch.Tensor:  # [B, Hq, D]
    qo_indptr = torch.arange(q.shape[0] + 1, dtype=torch.int64, device=q.device)
    return paged_attention_ref(
        q, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, scaling, window
    )


def rmsnorm_ref(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H]
) -> tuple[torch.Tensor, torch.Tensor]:  # normalized [T, H], new residual (x + residual) [T, H]
    """h = x + residual (or x); y = weight * (h / rms(h)) with the statistics in float32 and the
    normalized value cast to x.dtype before the weight multiply (transformers' order)."""
    h = x if residual is None else x + residual
    h32 = h.float()
    normed = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normed, h


def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox rotate-half RoPE: x [T, H, D], cos/sin [T, 1, D/2] in x.dtype -> new [T, H, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate then up) -> silu(gate) * up [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def store_kv_ref(
    k_buffer: torch.Tensor,  # [pool, Hkv, D], written
    v_buffer: torch.Tensor,
    loc: torch.Tensor,  # [T] slots; a negative slot means "write nothing" (padding)
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,
) -> None:
    keep = loc >= 0
    k_buffer[loc[keep]] = k[keep].to(k_buffer.dtype)
    v_buffer[loc[keep]] = v[keep].to(v_buffer.dtype)
