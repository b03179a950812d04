"""Iterate (name, tensor) over a folder of safetensors files, sharded or not; lazily for a
tensor-parallel rank, which reads only its slices."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from radixrt.layers.sharding import CheckpointTensor, Narrow

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


def iter_safetensors(
    model_dir: str | Path, lazy: bool = False
) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield every tensor of the folder's weight files, one at a time (CPU tensors).

    `lazy` yields SafetensorsSlice objects instead, valid until the next one is asked for: the
    loader reads from each just the rows or columns its rank holds.
    """
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
                yield name, SafetensorsSlice(f.get_slice(name)) if lazy else f.get_tensor(name)


class SafetensorsSlice:
    """One tensor of an open safetensors file (a LazyTensor): reading a range of it reads those
    bytes of the file only, never the whole tensor."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle  # safetensors' PySafeSlice
        self.shape = tuple(handle.get_shape())

    def read(self, narrow: Narrow | None) -> torch.Tensor:
        if narrow is None:
            return self._handle[:]
        tensor: torch.Tensor = self._handle[narrow.index(len(self.shape))]
        return tensor
