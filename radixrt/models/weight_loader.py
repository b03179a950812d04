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
    """Where one checkpoint tensor goes: a whole parameter, or one shard of a merged one, or
    (`shard` empty) every shard of a merged one from a tensor that stacks them; on a
    tensor-parallel rank, only the `narrow` part of the checkpoint's tensor."""

    param: nn.Parameter
    merged: MergedLinear | None = None
    shard: str = ""
    narrow: Narrow | None = None

    @property
    def fused(self) -> bool:
        return self.merged is not None and not self.shard

    def load(self, name: str, source: CheckpointTensor) -> None:
        if self.fused:
            self._load_fused(name, source)
            return
        dst = self.param.data
        if self.merged is not None:
            dst = self.merged.shard(self.shard, dst)
        tensor = _read(name, source, dst.shape, self.narrow)
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

    def _load_fused(self, name: str, source: CheckpointTensor) -> None:
        # One read per projection: on a rank, its rows of each out of the stacked tensor.
        assert self.merged is not None
        for shard, narrow in self.merged.fused_narrows():
            dst = self.merged.shard(shard, self.param.data)
            with torch.no_grad():
                dst.copy_(_read(name, source, dst.shape, narrow))


def _read(
    name: str, source: CheckpointTensor, dst_shape: torch.Size, narrow: Narrow | None
) -> torch.Tensor:
    """The checkpoint tensor, or its `narrow` part; ValueError naming `name` when the
    checkpoint's shape is not the one the (unsharded) parameter has."""
    want = list(dst_shape)
    if narrow is not None:
        want[narrow.dim] = narrow.full
    if list(source.shape) != want:
        raise ValueError(f"weight {name!r} has shape {tuple(source.shape)}, expected {tuple(want)}")
    if isinstance(source, torch.Tensor):
        return source if narrow is None else narrow.apply(source)
    return source.read(narrow)


def checkpoint_targets(model: nn.Module) -> dict[str, _Target]:
    """Every checkpoint name `model` needs -> its target. A MergedLinear's parameters are named
    by its shards: `attn.qkv_proj.weight` is needed as attn.q_proj/k_proj/v_proj.weight (or as
    one tensor that stacks them: `stacked_targets`). A sharded module names its parameters'
    parts in `checkpoint_narrows` (MergedLinear: its projections' in `shard_narrows`)."""
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


def stacked_targets(model: nn.Module) -> dict[str, _Target]:
    """The names under which a checkpoint may stack a MergedLinear's projections in one tensor
    (Phi-3's `qkv_proj.weight`, `gate_up_proj.weight`: the module's own names) -> a target
    that fills every shard from it."""
    return {
        _join(prefix, pname): _Target(param, module)
        for prefix, module in model.named_modules()
        if isinstance(module, MergedLinear)
        for pname, param in module.named_parameters(recurse=False)
    }


def load_hf_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, CheckpointTensor]],
    skip: Callable[[str], bool],
) -> None:
    """Load every (name, tensor) into `model`, except the names `skip` accepts.

    Raises ValueError for a name the model has no place for, a shape mismatch, or (after the
    last tensor) parameters no tensor filled, naming the first few.
    """
    needed = checkpoint_targets(model)
    targets = needed | stacked_targets(model)
    loaded: set[str] = set()
    progress = WeightProgress(len(needed))
    for name, tensor in weights:
        if skip(name):
            continue
        if name not in targets:
            raise ValueError(f"unexpected weight {name!r} for {type(model).__name__}")
        target = targets[name]
        target.load(name, tensor)
        filled = _parts(name, target) if target.fused else [name]
        loaded.update(filled)
        for _ in filled:
            progress.advance()
    missing = sorted(set(needed) - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ValueError(f"missing weights for {len(missing)} parameter(s): {shown}")


def _parts(name: str, target: _Target) -> list[str]:
    """The shard names a fused target's tensor `name` (…qkv_proj.weight) fills."""
    assert target.merged is not None
    stem, _, pname = name.rpartition(".")
    parent = stem.rpartition(".")[0]
    return [_join(parent, shard, pname) for shard in target.merged.shard_names]


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)
