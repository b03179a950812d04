"""Fused elementwise layers for the GPU: RMSNorm (+ residual add), rotary in place, SiLU-and-mul,
and the store of new K/V into their pool slots. Each is one kernel launch where torch takes
several, and reads/writes every element once.

Each kernel repeats the rounding steps of the torch path it replaces (`kernels.reference`, the
same as `radixrt.layers`): math in float32, a cast to the activation dtype wherever torch
rounds an intermediate, so that the outputs match it to the last bit or nearly (reductions
may add in another order).

All four are batch-invariant as they stand, so --enable-deterministic-inference needs no
variant of them: RMSNorm runs one program per row, summing that row alone in one block whose
size (and warp count) follows the hidden size only; rotary, SiLU-and-mul and the KV store
reduce nothing, each output element computed from its own row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(X, R, W, Y, H, stride_x, stride_r, stride_y, stride_h, n_cols, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)  # torch's x + r
        tl.store(H + row * stride_h + cols, x, mask=ok)
    x32 = x.to(tl.float32)
    var = tl.sum(x32 * x32, 0) / n_cols
    normed = (x32 * tl.rsqrt(var + eps)).to(X.dtype.element_ty)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (w * normed.to(tl.float32)).to(Y.dtype.element_ty), mask=ok)


def rmsnorm(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H]
) -> tuple[torch.Tensor, torch.Tensor]:  # normalized [T, H], new residual x + residual [T, H]
    """weight * (h / rms(h)) with h = x + residual (or x, returned as the residual)."""
    assert x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1)
    n_rows, n_cols = x.shape
    y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    h = x if residual is None else torch.empty_like(x)
    r = x if residual is None else residual  # unused without a residual
    block = triton.next_power_of_2(n_cols)
    if n_rows:
        _rmsnorm_kernel[(n_rows,)](
            x, r, weight, y, h, x.stride(0), r.stride(0), y.stride(0), h.stride(0), n_cols, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)),
        )  # fmt: skip
    return y, h


@triton.jit
def _rotary_kernel(X, Cos, Sin, stride_xt, stride_xh, stride_ct, stride_st, num_heads,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_HALF: tl.constexpr):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < HALF
    ok = (heads < num_heads)[:, None] & col_ok[None, :]
    IN = X.dtype.element_ty
    c = tl.load(Cos + t * stride_ct + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    s = tl.load(Sin + t * stride_st + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    ptrs = X + t * stride_xt + heads[:, None] * stride_xh + cols[None, :]
    x1 = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_HALF]
    x2 = tl.load(ptrs + HALF, mask=ok, other=0.0).to(tl.float32)
    # torch rounds each product to the activation dtype, then the difference / the sum.
    o1 = ((x1 * c).to(IN).to(tl.float32) - (x2 * s).to(IN).to(tl.float32)).to(IN)
    o2 = ((x2 * c).to(IN).to(tl.float32) + (x1 * s).to(IN).to(tl.float32)).to(IN)
    tl.store(ptrs, o1, mask=ok)
    tl.store(ptrs + HALF, o2, mask=ok)


def rotary_inplace(
    x: torch.Tensor,  # [T, H, D], rotated in place (may be a view into the fused qkv output)
    cos: torch.Tensor,  # [T, 1, D/2] in x.dtype
    sin: torch.Tensor,  # [T, 1, D/2]
) -> torch.Tensor:  # x
    """Neox rotate-half RoPE: x1, x2 = halves of D; x <- (x1 cos - x2 sin, x2 cos + x1 sin)."""
    n_tokens, num_heads, head_dim = x.shape
    assert x.stride(2) == 1 and cos.stride(2) == 1 and sin.stride(2) == 1
    half = head_dim // 2
    block_h = min(16, triton.next_power_of_2(num_heads))
    if n_tokens:
        _rotary_kernel[(n_tokens, triton.cdiv(num_heads, block_h))](
            x, cos, sin, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), num_heads,
            HALF=half, BLOCK_H=block_h, BLOCK_HALF=triton.next_power_of_2(half),
            # Without this, the compiler drops the float32 round trips and contracts
            # x1*c - x2*s into one FMA (fma.rn.f16 in the sm_90 PTX): one product unrounded,
            # unlike torch; on an H200, 6 of 3,584 float16 outputs differed by one step.
            enable_fp_fusion=False,
        )  # fmt: skip
    return x


@triton.jit
def _silu_and_mul_kernel(X, Y, stride_x, stride_y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    IN = X.dtype.element_ty
    gate = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(IN).to(tl.float32)  # F.silu, rounded like torch
    tl.store(Y + row * stride_y + cols, (act * up).to(IN), mask=ok)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate then up) -> silu(gate) * up, [T, I]."""
    assert gate_up.stride(-1) == 1
    n_rows, n_cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(n_rows, n_cols, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n_cols))
    if n_rows:
        _silu_and_mul_kernel[(n_rows, triton.cdiv(n_cols, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), n_cols, BLOCK=block
        )
    return out


@triton.jit
def _store_kv_kernel(K, V, Loc, KB, VB, stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_bt, stride_bh, num_heads, HEAD_DIM: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Loc + t).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    # The slot test as a block: the interpreter refuses a scalar in a mask.
    slot_ok = (tl.zeros([BLOCK_H, BLOCK_D], tl.int64) + slot) >= 0
    ok = (heads < num_heads)[:, None] & (dims < HEAD_DIM)[None, :] & slot_ok
    src = heads[:, None] * stride_kh + dims[None, :]
    dst = slot * stride_bt + heads[:, None] * stride_bh + dims[None, :]
    k = tl.load(K + t * stride_kt + src, mask=ok, other=0.0)
    tl.store(KB + dst, k.to(KB.dtype.element_ty), mask=ok)
    src = heads[:, None] * stride_vh + dims[None, :]
    v = tl.load(V + t * stride_vt + src, mask=ok, other=0.0)
    tl.store(VB + dst, v.to(VB.dtype.element_ty), mask=ok)


def store_kv(
    k_buffer: torch.Tensor,  # [pool, Hkv, D], written
    v_buffer: torch.Tensor,  # [pool, Hkv, D] (same layout as k_buffer), written
    loc: torch.Tensor,  # [T] int64 slots; a negative slot writes nothing (CUDA-graph padding)
    k: torch.Tensor,  # [T, Hkv, D], may be strided views into the fused qkv output
    v: torch.Tensor,  # [T, Hkv, D]
) -> None:
    """Write the new tokens' K and V into their pool slots, cast to the pool's dtype."""
    n_tokens, num_heads, head_dim = k.shape
    assert k_buffer.stride() == v_buffer.stride() and k_buffer.stride(2) == 1
    assert k.stride(2) == 1 and v.stride(2) == 1
    if n_tokens:
        _store_kv_kernel[(n_tokens,)](
            k, v, loc, k_buffer, v_buffer, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_buffer.stride(0), k_buffer.stride(1), num_heads, HEAD_DIM=head_dim,
            BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_D=triton.next_power_of_2(head_dim),
        )  # fmt: skip
