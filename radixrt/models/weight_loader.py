"""Copy Hugging Face-named checkpoint tensors into a model whose projections may be merged."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from radixrt.layers.linear import MergedLinear
from radixrt.loader.progress import WeightProgress


@dataclass(frozen=True)
class _Target:
    """Where one checkpoint tensor goes: a whole parameter, or one shard of a merged one."""

    param: nn.Parameter
    merged: MergedLinear | None = None
    shard: str = ""

    def load(self, name: str, tensor: torch.Tensor) -> None:
        dst = self.param.data
        if self.merged is not None:
            dst = self.merged.shard(self.shard, dst)
        if dst.shape != tensor.shape:
            raise ValueError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
            )
        if self.merged is None:
            # Adopt the tensor rather than copy it into the empty parameter: saves a pass over
            # freshly allocated memory (a third of the GGUF load time on the CPU).
            self.param.data = tensor.to(device=dst.device, dtype=dst.dtype).contiguous()
        else:
            with torch.no_grad():
                dst.copy_(tensor)


def checkpoint_targets(model: nn.Module) -> dict[str, _Target]:
    """Every checkpoint name `model` needs -> its target. A MergedLinear's parameters are named
    by its shards: `attn.qkv_proj.weight` is needed as attn.q_proj/k_proj/v_proj.weight."""
    targets: dict[str, _Target] = {}
    for prefix, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if isinstance(module, MergedLinear):
                parent = prefix.rpartition(".")[0]
                for shard in module.shard_names:
                    targets[_join(parent, shard, pname)] = _Target(param, module, shard)
            else:
                targets[_join(prefix, pname)] = _Target(param)
    return targets


def load_hf_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
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
