"""The package list in pyproject equals the folders that hold an __init__.py, and the light
imports stay light."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_package_list_matches_folders():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for init in ROOT.glob("**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts[0] in (".venv", "tests", "build") or rel.parts[0].startswith("."):
            continue
        dotted = ".".join(rel.parts)
        for pkg, folder in mapping.items():
            if dotted == folder or dotted.startswith(folder + "."):
                dotted = pkg + dotted[len(folder) :]
        found.add(dotted)
    assert declared == found


def test_import_radixrt_does_not_load_torch():
    code = (
        "import sys, radixrt, radixrt.lang; "
        "heavy = [m for m in ('torch', 'transformers', 'triton') if m in sys.modules]; "
        "assert not heavy, heavy; assert radixrt.Engine is not None"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow  # a fresh interpreter importing transformers
def test_checkout_root_on_sys_path_does_not_shadow_hugging_face_kernels():
    # `python -m radixrt.cli` or `python -c` run from the checkout put its root first on
    # sys.path, where kernels/ (installed as radixrt.kernels) is a top-level `kernels` too.
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's `kernels` is not installed: nothing to shadow")
    code = (
        "import kernels, radixrt.kernels as ours; "
        "from transformers.integrations import hub_kernels; "
        "assert hasattr(kernels, 'get_kernel'), kernels.__file__; "
        "assert hasattr(ours, 'has_triton') and kernels is not ours; print(kernels.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    )
    assert str(ROOT / "kernels") not in out.stdout
