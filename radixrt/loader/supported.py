"""Whether this runtime has a model for a path's architecture, decided from its config.json or
its GGUF header alone: torch-free and quick, so that an Engine refuses an unsupported model
before it loads a tokenizer or starts a process."""

from __future__ import annotations

import json
from pathlib import Path

from radixrt.loader.gguf_metadata import ARCHS, check_architecture, read_architecture
from radixrt.models.registry import check_supported


def refuse_unsupported(model_path: str) -> None:
    """ValueError naming the architecture and the supported ones; nothing for a path that is
    neither a GGUF file nor a folder with a readable config.json (the loader says why later)."""
    path = Path(model_path)
    if path.is_file() and path.suffix == ".gguf":
        check_supported(ARCHS[check_architecture(read_architecture(path))][1])
        return
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return
    archs = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        check_supported(archs[0])
