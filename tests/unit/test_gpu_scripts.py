"""The GPU check's CPU side: scripts/gpu_engine_check.py's CPU reference and comparison, and
scripts/gpu_check.sh's part handling (the GPU parts themselves run only on a GPU machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)

import gpu_engine_check  # noqa: E402


def test_first_difference_names_the_prompt_and_token():
    ref = [[1, 2, 3], [4, 5, 6]]
    assert gpu_engine_check.first_difference(ref, [[1, 2, 3], [4, 5, 6]]) == "-"
    assert gpu_engine_check.first_difference(ref, [[1, 2, 3], [4, 9, 6]]) == "prompt 1, token 1"
    assert gpu_engine_check.first_difference(ref, [[1, 2], [4, 5, 6]]) == "prompt 0, token 2"


@pytest.mark.slow  # runs the reference script end to end on a tiny model
def test_cpu_reference_holds_the_ids_the_gpu_run_will_feed(tiny_model_dir, tmp_path):
    """--write-cpu-reference on a tiny model: the prompts' ids, each sequence's greedy tokens,
    and the repeat's cached tokens (the long prompt again: all but its last token)."""
    path = tiny_model_dir("llama", max_position_embeddings=4096)
    out = tmp_path / "ref.json"
    script = os.path.join(SCRIPTS, "gpu_engine_check.py")
    args = [sys.executable, script, "--model-path", path, "--write-cpu-reference", str(out)]
    subprocess.run(args, check=True, capture_output=True, timeout=300)
    ref = json.loads(out.read_text())
    texts = [*gpu_engine_check.TEXTS, gpu_engine_check.LONG_TEXT]
    assert [len(ids) for ids in ref["ids"]] == [len(t.encode()) for t in texts]  # byte tokens
    assert len(ref["tokens"]) == len(texts) + 1
    assert all(len(t) == gpu_engine_check.MAX_NEW for t in ref["tokens"])
    assert ref["tokens"][-1] == ref["tokens"][-2]  # greedy, float32: the repeat is the same
    assert ref["cached"] == len(ref["ids"][-1]) - 1


@pytest.mark.parametrize("part", ["nope", "engine,serving"])
def test_gpu_check_refuses_an_unknown_part(part, tmp_path):
    script = os.path.join(SCRIPTS, "gpu_check.sh")
    env = {**os.environ, "OUT": str(tmp_path)}
    run = subprocess.run(["bash", script, part], capture_output=True, text=True, env=env)
    assert run.returncode == 2
    assert f"unknown part {part}" in run.stdout
    assert "setup, kernels, bench-kernels, engine or serving" in run.stdout
