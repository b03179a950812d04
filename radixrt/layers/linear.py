"""A linear layer that is several Hugging Face projections stacked into one matmul."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MergedLinear(nn.Linear):
    """y = x @ W.T (+ b) with W = cat(W_a, W_b, ...) along the output rows.

    One matmul instead of several (q/k/v, gate/up). `shard_names` are the checkpoint's names of
    the stacked projections, in order; `shard(name, param)` is the part of `param` (the weight
    or the bias) that the checkpoint's tensor of that name fills.
    """

    def __init__(
        self, in_features: int, shard_sizes: Sequence[int], shard_names: Sequence[str], bias: bool
    ) -> None:
        assert len(shard_sizes) == len(shard_names)
        super().__init__(in_features, sum(shard_sizes), bias)
        self.shard_sizes = tuple(shard_sizes)
        self.shard_names = tuple(shard_names)

    def shard(self, name: str, param: torch.Tensor) -> torch.Tensor:
        """The rows of `param` (a view) that the projection `name` owns."""
        index = self.shard_names.index(name)
        start = sum(self.shard_sizes[:index])
        return param.narrow(0, start, self.shard_sizes[index])
