"""Copy Hugging Face-named checkpoint tensors into a model whose projections may be merged and
whose parameters may be one tensor-parallel rank's shards of the checkpoint's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from radixrt.layers.linear import MergedLinear
from radixrt.layers.sharding import CheckpointTensor, Narrow
from radixrt.models.load_progress import WeightProgress


@dataclass(frozen=True)
class _Target:
    """Where one checkpoint tensor goes: a whole parameter, or one shard of a merged one; on a
    tensor-parallel rank, only the `narrow` part of the checkpoint's tensor."""

    param: nn.Parameter
    merged: MergedLinear | None = None
    shard: str = ""
    narrow: Narrow | None = None

    def load(self, name: str, source: CheckpointTensor) -> None:
        dst = self.param.data
        if self.merged is not None:
            dst = self.merged.shard(self.shard, dst)
        tensor = self._read(name, source, dst.shape)
        if self.narrow is not None and self.narrow.padded:
            # The last ranks of a padded vocabulary: the rows past its end stay zero.
            padded = torch.zeros(dst.shape, dtype=tensor.dtype)
            padded.narrow(self.narrow.dim, 0, self.narrow.length).copy_(tensor)
            tensor = padded
        if self.merged is None:
            # Adopt the tensor rather than copy it into the empty parameter: saves a pass over
            # freshly allocated memory (a third of the GGUF load time on the CPU).
            self.param.data = tensor.to(device=dst.device, dtype=dst.dtype).contiguous()
        else:
            with torch.no_grad():
                dst.copy_(tensor)

    def _read(self, name: str, source: CheckpointTensor, dst_shape: torch.Size) -> torch.Tensor:
        """The checkpoint tensor, or its `narrow` part; ValueError naming `name` when the
        checkpoint's shape is not the one the (unsharded) parameter has."""
        want = list(dst_shape)
        if self.narrow is not None:
            want[self.narrow.dim] = self.narrow.full
        if list(source.shape) != want:
            raise ValueError(
                f"weight {name!r} has shape {tuple(source.shape)}, expected {tuple(want)}"
            )
        if isinstance(source, torch.Tensor):
            return source if self.narrow is None else self.narrow.apply(source)
        return source.read(self.narrow)


def checkpoint_targets(model: nn.Module) -> dict[str, _Target]:
    """Every checkpoint name `model` needs -> its target. A MergedLinear's parameters are named
    by its shards: `attn.qkv_proj.weight` is needed as attn.q_proj/k_proj/v_proj.weight. A
    sharded module names its parameters' parts in `checkpoint_narrows` (MergedLinear: its
    projections' in `shard_narrows`)."""
    targets: dict[str, _Target] = {}
    for prefix, module in model.named_modules():
        narrows: dict[str, Narrow] = getattr(module, "checkpoint_narrows", {})
        for pname, param in module.named_parameters(recurse=False):
            if isinstance(module, MergedLinear):
                parent = prefix.rpartition(".")[0]
                for shard in module.shard_names:
                    narrow = module.shard_narrows.get(shard)
                    targets[_join(parent, shard, pname)] = _Target(param, module, shard, narrow)
            else:
                targets[_join(prefix, pname)] = _Target(param, narrow=narrows.get(pname))
    return targets


def load_hf_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, CheckpointTensor]],
    skip: Callable[[str], bool],
) -> None:
    """Load every (name, tensor) into `model`, except the names `skip` accepts.

    Raises ValueError for a name the model has no place for, a shape mismatch, or (after the
    last tensor) parameters no tensor filled, naming the first few.
    """
    targets = checkpoint_targets(model)
    loaded: set[str] = set()
    progress = WeightProgress(len(targets))
    for name, tensor in weights:
        if skip(name):
            continue
        if name not in targets:
            raise ValueError(f"unexpected weight {name!r} for {type(model).__name__}")
        targets[name].load(name, tensor)
        loaded.add(name)
        progress.advance()
    missing = sorted(set(targets) - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ValueError(f"missing weights for {len(missing)} parameter(s): {shown}")


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)
