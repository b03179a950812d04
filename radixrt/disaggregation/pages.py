"""KV pages as raw bytes: read a request's slots out of the pool, write received ones in."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from radixrt.cache.kv_pool import KVPool
from radixrt.disaggregation.messages import KVLayout


def layout_of(pool: KVPool) -> KVLayout:
    return KVLayout(
        pool.num_layers, pool.num_kv_heads, pool.head_dim, str(pool.dtype).removeprefix("torch.")
    )


def max_frame_bytes(pool: KVPool) -> int:
    """The largest frame a legitimate answer holds: one layer's K (or V) for every slot of
    the pool (a prompt longer than the pool cannot be admitted), or a header."""
    itemsize = torch.empty((), dtype=pool.dtype).element_size()
    return max(pool.size * pool.num_kv_heads * pool.head_dim * itemsize, 64 * 1024)


def read_slots(pool: KVPool, slots: torch.Tensor) -> list[memoryview]:
    """Every layer's K then V at `slots` (int64 [n]), each as one contiguous buffer."""
    if slots.numel() == 0:  # the decode side held the whole prompt: nothing to send
        return [memoryview(b"")] * (2 * pool.num_layers)
    frames = []
    for layer in range(pool.num_layers):
        for buffer in pool.get_kv(layer):
            rows = buffer.index_select(0, slots.to(buffer.device)).cpu().contiguous()
            frames.append(memoryview(rows.view(torch.uint8).numpy().data).cast("B"))
    return frames


def write_slots(pool: KVPool, slots: torch.Tensor, frames: Sequence[bytes | memoryview]) -> int:
    """Store frames (read_slots' order and layout) into `slots`; returns the bytes written.
    ValueError if their number or sizes do not fit."""
    if len(frames) != 2 * pool.num_layers:
        raise ValueError(f"expected {2 * pool.num_layers} frames of K/V, got {len(frames)}")
    shape = (slots.numel(), pool.num_kv_heads, pool.head_dim)
    itemsize = torch.empty((), dtype=pool.dtype).element_size()
    expected = shape[0] * shape[1] * shape[2] * itemsize
    if expected == 0:
        return 0
    layers = []
    for i, frame in enumerate(frames):
        if len(frame) != expected:
            raise ValueError(f"K/V frame {i} holds {len(frame)} bytes, expected {expected}")
        with warnings.catch_warnings():  # a received frame is read-only: it is only read
            warnings.simplefilter("ignore", UserWarning)
            layers.append(torch.frombuffer(frame, dtype=pool.dtype).view(shape).to(pool.device))
    loc = slots.to(device=pool.device, dtype=torch.int64).contiguous()
    for layer in range(pool.num_layers):  # the pool's own store (one native call on the CPU)
        pool.set_kv(layer, loc, layers[2 * layer], layers[2 * layer + 1])
    return expected * len(frames)
