"""Attention over a prefix that several queries share, merged with each query's own keys
through the log-sum-exp of their scores ("cascade" attention): the prefix's K/V are read once
for the whole group instead of once per sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixrt.attention.torch_backend import OwnKeysMetadata, SharedExtendMetadata


def merge(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> torch.Tensor:
    """Combine two attentions of the same queries over disjoint key sets: o [..., D] and the
    log-sum-exp of their scores lse [...] -> the attention over the union (float32)."""
    lse = torch.logaddexp(lse1, lse2)
    return o1.float() * torch.exp(lse1 - lse).unsqueeze(-1) + o2.float() * torch.exp(
        lse2 - lse
    ).unsqueeze(-1)


def shared_extend(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: SharedExtendMetadata,
    scaling: float,
    out: torch.Tensor,  # [T, Hq, D], written at the group's rows
) -> None:
    t, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    rows = meta.rows.numel()
    q_group = q.index_select(0, meta.rows).view(rows, hkv, g, d)
    # The shared prefix is older than every new token: no mask, one block for all of them.
    o_pre, lse_pre = shared_prefix_attention(
        q_group, k_cache, v_cache, meta.prefix_slots, scaling
    )  # [N, Hkv, G, D], [N, Hkv, G]
    offset = 0
    for ext in meta.extends:
        n = ext.end - ext.start
        o_own, lse_own = own_keys_attention(
            q_group[offset : offset + n], k_cache, v_cache, ext, scaling
        )
        merged = merge(o_pre[offset : offset + n], lse_pre[offset : offset + n], o_own, lse_own)
        out[ext.start : ext.end] = merged.to(q.dtype).reshape(n, hq, d)
        offset += n


def own_keys_attention(
    qg: torch.Tensor,  # [n, Hkv, G, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ext: OwnKeysMetadata,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # [n, Hkv, G, D], [n, Hkv, G]
    n, hkv, g, d = qg.shape
    k = k_cache.index_select(0, ext.slots).transpose(0, 1).unsqueeze(0).to(qg.dtype)
    v = v_cache.index_select(0, ext.slots).transpose(0, 1).unsqueeze(0).to(qg.dtype)
    # GQA: the G heads sharing a kv head become rows (token i, head j) -> i * G + j, each
    # with its token's causal mask row.
    q_rows = qg.permute(1, 0, 2, 3).reshape(1, hkv, n * g, d)
    mask = ext.mask.repeat_interleave(g, dim=0)[None, None]  # [1, 1, n*G, L]
    o, lse = attention_with_lse(q_rows, k, v, mask, scaling)
    o = o.view(hkv, n, g, d).permute(1, 0, 2, 3)
    return o, lse.view(hkv, n, g).permute(1, 0, 2)


def shared_prefix_attention(
    qg: torch.Tensor,  # [Bd, Hkv, G, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_slots: torch.Tensor,  # [P]
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # [Bd, Hkv, G, D], [Bd, Hkv, G]
    """Every query of the batch against the one shared prefix: a dense [Bd*G, P] block per kv
    head, reading the prefix's K/V once instead of once per sequence."""
    bd, hkv, g, d = qg.shape
    kp = k_cache.index_select(0, prefix_slots).transpose(0, 1).unsqueeze(0).to(qg.dtype)
    vp = v_cache.index_select(0, prefix_slots).transpose(0, 1).unsqueeze(0).to(qg.dtype)
    qp = qg.permute(1, 0, 2, 3).reshape(1, hkv, bd * g, d)
    o, lse = attention_with_lse(qp, kp, vp, None, scaling)
    o = o.view(hkv, bd, g, d).permute(1, 0, 2, 3)
    return o, lse.view(hkv, bd, g).permute(1, 0, 2)


def attention_with_lse(
    q: torch.Tensor,  # [B, H, Lq, D]
    k: torch.Tensor,  # [B, H, Lk, D]
    v: torch.Tensor,
    mask: torch.Tensor | None,  # additive, broadcastable to [B, H, Lq, Lk]
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # [B, H, Lq, D], [B, H, Lq] float32
    """Attention that also returns the log-sum-exp of each row's scores, for merging."""
    if q.device.type == "cpu":
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        o, lse = flash(q, k, v, 0.0, False, attn_mask=mask, scale=scaling)
        return o, lse
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scaling
    if mask is not None:
        s = s + mask
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.float()).to(q.dtype), lse
