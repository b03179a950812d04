"""Which part of a checkpoint tensor a tensor-parallel rank holds.

A sharded parameter holds one contiguous range of its checkpoint tensor along one dimension: a
column-parallel projection some output rows, a row-parallel one some input columns, a
vocab-parallel table some vocabulary rows. `Narrow` names that range; the loaders read just it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from radixrt.distributed import TPGroup


@dataclass(frozen=True)
class Narrow:
    """Elements [start, start + length) along `dim` of a checkpoint tensor `full` long there.

    `padded` is the parameter's (larger) size along `dim` where the range is shorter, as on the
    last rank of a vocabulary padded to a multiple of the ranks; the rest is zeros.
    """

    dim: int
    start: int
    length: int
    full: int
    padded: int = 0

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        """The range of an in-memory tensor (a view)."""
        return tensor.narrow(self.dim, self.start, self.length)

    def index(self, ndim: int) -> tuple[slice, ...]:
        """The range as an index for `ndim` dimensions (safetensors' get_slice takes these)."""
        index = [slice(None)] * ndim
        index[self.dim] = slice(self.start, self.start + self.length)
        return tuple(index)


def even_split(full: int, group: TPGroup, what: str) -> tuple[int, int]:
    """(start, length) of this rank's equal part of `full`; ValueError naming --tp-size and
    `what` when the ranks don't divide it."""
    if full % group.size:
        raise ValueError(f"{what} ({full}) must be divisible by --tp-size ({group.size})")
    length = full // group.size
    return group.rank * length, length


def vocab_split(vocab_size: int, group: TPGroup) -> tuple[int, int, int]:
    """(start, rows held, rows read) of this rank's part of a vocabulary padded up to a multiple
    of the ranks; the last ranks read fewer rows than they hold (the padding)."""
    per_rank = -(-vocab_size // group.size)
    start = group.rank * per_rank
    return start, per_rank, max(0, min(per_rank, vocab_size - start))


class LazyTensor(Protocol):
    """A checkpoint tensor not read yet, of which a loader reads only the part it needs."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def read(self, narrow: Narrow | None) -> torch.Tensor:
        """The whole tensor (None) or just the `narrow` range of it."""
        ...


CheckpointTensor = torch.Tensor | LazyTensor
