"""The KV pool: one preallocated K and V buffer per layer, indexed by token slot.

Slots are grouped into pages of `page_size` consecutive slots (page p owns slots
p*page_size .. p*page_size+page_size-1); the allocator hands out pages, the page table of each
request lists its slots in position order.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import torch

from radixrt.native.build import load_native


class KVPool:
    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        self.size = size  # in token slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (size, num_kv_heads, head_dim)
        self.k_buffer = [_zeros(shape, dtype, self.device) for _ in range(num_layers)]
        self.v_buffer = [_zeros(shape, dtype, self.device) for _ in range(num_layers)]
        # On the CPU one native call stores a step's K and V (two index_puts otherwise).
        self._native: Any | None = load_native() if self.device.type == "cpu" else None

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new K/V ([T, num_kv_heads, head_dim]) into slots `loc` ([T]) of one layer."""
        if self._native is not None and _native_storable(loc, k, v, self.dtype):
            self._native.store_kv(self.k_buffer[layer_id], self.v_buffer[layer_id], loc, k, v)
            return
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's K/V of slots `src` into slots `dst` (int64 [n] each): a beam
        that forks inside a page gets its own copy of that page (copy on write)."""
        src, dst = src.to(self.device), dst.to(self.device)
        for buffers in (self.k_buffer, self.v_buffer):
            for layer in buffers:
                layer[dst] = layer[src]

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.tensor([], dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * itemsize


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed buffer. On the CPU it is an anonymous memory map: the kernel hands out zero
    pages and commits each only when a token is first written there, so the pool takes memory
    as it fills (torch.zeros would write, and make resident, the whole budget at start)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, numel * itemsize)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)  # keeps `buffer` alive


def _native_storable(
    loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype
) -> bool:
    # The native store copies each token's heads as one run of memory, in the pool's dtype.
    return (
        loc.dtype == torch.int64
        and loc.is_contiguous()
        and k.dtype == v.dtype == dtype
        and all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (k, v))
        and not torch.compiler.is_compiling()
    )
