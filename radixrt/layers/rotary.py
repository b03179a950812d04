"""Rotary position embedding (RoPE), with linear and Llama-3 frequency scaling.

The inverse frequencies are computed exactly as transformers computes them, and cos/sin are taken
in float32 then cast to the activation dtype, so that our q/k equal the reference's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from radixrt.layers.fused import use_triton

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(config: Any) -> dict[str, Any]:
    """The RoPE settings of a Hugging Face config as one dict with `rope_type` and `rope_theta`.

    transformers >= 5 keeps them in `config.rope_parameters`; older versions in `rope_theta` and
    `rope_scaling`. Raises ValueError for a rope type or a partial rotary factor we can't honour.
    """
    params = getattr(config, "rope_parameters", None)
    if params is None:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params = dict(params)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling.rope_type must be one of {list(SUPPORTED_ROPE_TYPES)}, "
            f"got {params['rope_type']!r}"
        )
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise ValueError(f"partial_rotary_factor must be 1.0, got {factor}")
    return params


def compute_inv_freq(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """Inverse frequencies, [head_dim // 2] float32 on the CPU."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (params["rope_theta"] ** exponents)
    if params["rope_type"] == "linear":
        inv_freq = inv_freq / params["factor"]
    elif params["rope_type"] == "llama3":
        inv_freq = _llama3_scale(inv_freq, params)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, and the band in
    # between interpolated smoothly.
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
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

    def __init__(self, head_dim: int, params: dict[str, Any]) -> None:
        self.head_dim = head_dim
        self.inv_freq = compute_inv_freq(head_dim, params)  # [D/2] float32, CPU
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
    """apply_rotary for the model: on CUDA the fused kernel rotates qk [T, H, D] in place (a view
    into the qkv projection: no copy) and returns it; elsewhere a new tensor."""
    if use_triton(qk):
        from radixrt.kernels.fused_layers import rotary_inplace

        return rotary_inplace(qk, cos, sin)
    return apply_rotary(qk, cos, sin)
