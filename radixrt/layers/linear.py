"""Linear layers: several Hugging Face projections stacked into one matmul, split over the
tensor-parallel ranks by output rows (column-parallel) or by input columns (row-parallel)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from radixrt.distributed import TPGroup
from radixrt.layers.fused import dense_linear
from radixrt.layers.quantized import GGUFWeight
from radixrt.layers.sharding import Narrow, even_split


class PackableLinear(nn.Linear):
    """nn.Linear whose weight may be swapped for GGUF blocks after loading (`pack`)."""

    packed: GGUFWeight | None

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__(in_features, out_features, bias)
        self.packed = None  # an instance attribute: nn.Module keeps submodules in _modules

    def pack(self, weight: GGUFWeight) -> None:
        """Use `weight` from now on and drop the dense parameter."""
        if (weight.out_features, weight.in_features) != (self.out_features, self.in_features):
            raise ValueError(f"packed weight {weight} does not fit {self}")
        self.packed = weight
        del self.weight
        self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x, self.bias)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.packed is None:
            return dense_linear(x, self.weight, bias)
        y = self.packed(x)
        return y if bias is None else y + bias


class MergedLinear(PackableLinear):
    """y = x @ W.T (+ b) with W = cat(W_a, W_b, ...) along the output rows.

    One matmul instead of several (q/k/v, gate/up). `shard_names` are the checkpoint's names of
    the stacked projections, in order, and `shard_sizes` the rows each fills here;
    `shard(name, param)` is the part of `param` (the weight or the bias) that the checkpoint's
    tensor of that name fills. Column-parallel: on a rank of a tensor-parallel group each part
    holds only its rows of the checkpoint's projection, `shard_narrows[name]` (none at tp=1),
    so the output is this rank's slice of each projection and needs no communication.
    """

    def __init__(
        self,
        in_features: int,
        shard_sizes: Sequence[int],
        shard_names: Sequence[str],
        bias: bool,
        shard_narrows: Mapping[str, Narrow] | None = None,
    ) -> None:
        assert len(shard_sizes) == len(shard_names)
        super().__init__(in_features, sum(shard_sizes), bias)
        self.shard_sizes = tuple(shard_sizes)
        self.shard_names = tuple(shard_names)
        self.shard_narrows = dict(shard_narrows or {})

    @classmethod
    def column_parallel(
        cls,
        in_features: int,
        full_sizes: Sequence[int],
        shard_names: Sequence[str],
        bias: bool,
        group: TPGroup,
    ) -> MergedLinear:
        """Each projection split into equal row ranges, this rank holding its own."""
        if group.size == 1:
            return cls(in_features, full_sizes, shard_names, bias)
        narrows = {}
        for name, full in zip(shard_names, full_sizes, strict=True):
            start, length = even_split(full, group, f"{name} output size")
            narrows[name] = Narrow(0, start, length, full)
        return cls(in_features, [n.length for n in narrows.values()], shard_names, bias, narrows)

    def shard(self, name: str, param: torch.Tensor) -> torch.Tensor:
        """The rows of `param` (a view) that the projection `name` owns."""
        index = self.shard_names.index(name)
        start = sum(self.shard_sizes[:index])
        return param.narrow(0, start, self.shard_sizes[index])

    def fused_narrows(self) -> list[tuple[str, Narrow]]:
        """Where each projection's rows (this rank's part of them) lie in a checkpoint tensor
        that stacks the whole projections in shard order (Phi-3's qkv_proj, gate_up_proj)."""
        fulls = [
            self.shard_narrows[n].full if n in self.shard_narrows else size
            for n, size in zip(self.shard_names, self.shard_sizes, strict=True)
        ]
        out, offset = [], 0
        for name, size, full in zip(self.shard_names, self.shard_sizes, fulls, strict=True):
            part = self.shard_narrows.get(name)
            start = offset + (part.start if part is not None else 0)
            out.append((name, Narrow(0, start, size, sum(fulls))))
            offset += full
        return out


class RowParallelLinear(PackableLinear):
    """y = x @ W.T (+ b), each rank holding the input columns of W its (sharded) input x
    carries: partial products summed by an all-reduce, the bias added once after it.

    `checkpoint_narrows` gives the loader the weight's columns; the bias is whole on every rank.
    At tp=1 this is exactly nn.Linear.
    """

    def __init__(self, full_in: int, out_features: int, bias: bool, group: TPGroup) -> None:
        start, length = even_split(full_in, group, "row-parallel input size")
        super().__init__(length, out_features, bias)
        self.group = group
        sharded = group.size > 1
        self.checkpoint_narrows = {"weight": Narrow(1, start, length, full_in)} if sharded else {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return self.linear(x, self.bias)
        y = self.group.all_reduce(self.linear(x, None))
        return y if self.bias is None else y + self.bias
