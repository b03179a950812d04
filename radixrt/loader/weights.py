"""Iterate (name, tensor) over a folder of safetensors files, sharded or not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

_INDEX = "model.safetensors.index.json"


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a folder, in a stable order.

    With an index file, exactly the shards it lists (a folder may also hold, say, a consolidated
    copy of the same weights); without one, every *.safetensors. FileNotFoundError if none.
    """
    folder = Path(model_dir)
    index = folder / _INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / s for s in shards]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{index} lists missing weight files: {absent}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weight files in {folder}")
    return files


def iter_safetensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every tensor of the folder's weight files, one at a time (CPU tensors)."""
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
                yield name, f.get_tensor(name)
