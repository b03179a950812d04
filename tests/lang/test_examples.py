"""Smoke test of examples/: each one runs as a script against the shared default-model server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
HEAVY_MODULES = ("torch", "transformers", "triton")


def run_example(name: str, url: str) -> str:
    """Run examples/NAME.py --url URL; its stdout (fails with its output if it exits non-0)."""
    proc = subprocess.run(
        [sys.executable, f"examples/{name}.py", "--url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, (
        f"{name} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


def test_few_shot_select(lang_server):
    out = run_example("few_shot_select", lang_server.url)
    labels = re.findall(r"^\s*(\S+)  ", out, re.M)
    assert len(labels) == 4 and set(labels) <= {"positive", "negative"}, out
    hit_rate = int(re.search(r"cache hit rate (\d+)%", out).group(1))
    assert hit_rate >= 50, out  # the few-shot prefix is prefilled once for the whole batch


def test_rag_citations(lang_server):
    out = run_example("rag_citations", lang_server.url)
    assert re.search(r"^Answer: \S", out, re.M), out
    assert re.search(r"^Citation: \[[12]\] -> ", out, re.M), out  # two documents retrieved


def test_react_agent(lang_server):
    out = run_example("react_agent", lang_server.url)
    assert re.search(r"^Action: (calculator|capital)$", out, re.M), out  # step 1 is a tool
    assert re.search(r"^Observation: ", out, re.M), out
    assert re.search(r"^Final answer: \S", out, re.M), out


def test_tree_of_thought(lang_server):
    out = run_example("tree_of_thought", lang_server.url)
    branches = re.findall(
        r"^branch (\d) \[(good|bad)\] \((\d+)/(\d+) prompt tokens cached\)", out, re.M
    )
    assert [b[0] for b in branches] == ["0", "1", "2"], out
    # The shared prefix was prefilled once before forking: every branch finds most of its
    # prompt in the cache.
    assert all(int(cached) >= int(prompt) // 2 for _, _, cached, prompt in branches), out
    assert re.search(r"^Best: branch [012]: ", out, re.M), out


def test_multi_turn_chat(lang_server):
    out = run_example("multi_turn_chat", lang_server.url)
    assert len(re.findall(r"^\s*user: ", out, re.M)) == 2, out
    assert len(re.findall(r"^\s*assistant: \S", out, re.M)) == 2, out
    assert re.search(r"^streaming: \S.*\n\((\d+) pieces\)", out, re.M), out


def test_json_extraction(lang_server):
    out = run_example("json_extraction", lang_server.url)
    info = json.loads(re.search(r"^JSON: (.*)$", out, re.M).group(1))
    assert set(info) == {"name", "age", "city"} and isinstance(info["age"], int), out
    assert re.search(r"^gen_int age: -?\d+$", out, re.M), out


@pytest.mark.parametrize("name", ["json_extraction"])
def test_examples_import_nothing_heavy(lang_server, name):
    """Against a server (--url), an example needs only the light client: no torch."""
    code = (
        f"import runpy, sys; sys.argv = ['{name}.py', '--url', {lang_server.url!r}]; "
        "sys.path.insert(0, 'examples'); "
        f"runpy.run_path('examples/{name}.py', run_name='__main__'); "
        f"heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]; "
        f"assert not heavy, f'imported {{heavy}}'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
