"""Rotary position embedding (RoPE), with linear and Llama-3 frequency scaling.

The inverse frequencies are computed exactly as transformers computes them, and cos/sin are taken
in float32 then cast to the activation dtype, so that our q/k equal the reference's.
"""

from __future__ import annotations

import math

import torch

from radixrt.layers.config import RopeConfig
from radixrt.layers.fused import native_cpu, use_triton


def compute_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Inverse frequencies, [head_dim // 2] float32 on the CPU."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.kind == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.kind == "llama3":
        inv_freq = _llama3_scale(inv_freq, rope)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, and the band in
    # between interpolated smoothly.
    factor = rope.factor
    low, high = rope.low_freq_factor, rope.high_freq_factor
    old_len = rope.original_max_positions
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Neox-style RoPE (the rotate-half layout Hugging Face Llama/Qwen2/Mistral use).

    Not an nn.Module on purpose: it holds no weights, and a plain attribute survives building the
    model on the meta device.
    """

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        self.head_dim = head_dim
        self.inv_freq = compute_inv_freq(head_dim, rope)  # [D/2] float32, CPU
        self._per_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for each position: [T] -> two [T, 1, D/2] tensors in `dtype`.

        Computed once per forward and shared by every layer.
        """
        device = positions.device
        inv_freq = self._per_device.get(device)
        if inv_freq is None:
            inv_freq = self._per_device.setdefault(device, self.inv_freq.to(device))
        freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
        return freqs.cos().to(dtype)[:, None, :], freqs.sin().to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by cos/sin [T, 1, D/2]; returns a new [T, H, D] tensor."""
    x1, x2 = x.chunk(2, dim=-1)
    # Same products and sums as transformers' q*cos + rotate_half(q)*sin, hence the same rounding.
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotate_qk(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary for the model: on CUDA and the CPU a fused kernel rotates qk [T, H, D] in
    place (a view into the qkv projection: no copy) and returns it; else a new tensor."""
    if use_triton(qk):
        from radixrt.kernels.fused_layers import rotary_inplace

        return rotary_inplace(qk, cos, sin)
    ops = native_cpu(qk)
    if ops is not None and qk.stride(-1) == 1 and cos.dtype == qk.dtype:
        ops.rotary_(qk, cos.contiguous(), sin.contiguous())
        return qk
    return apply_rotary(qk, cos, sin)
