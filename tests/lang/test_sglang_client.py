"""SGLang's own, unmodified frontend client (the real `sglang` 0.5.23 wheel, installed with
--no-deps into a throw-away venv that reuses this venv's packages) against `radixrt launch`:
gen, select, run_batch, fork (both joins), gen_int, regex, streaming, get_server_info and
flush_cache."""

from __future__ import annotations

import contextlib
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SGLANG = "sglang==0.5.23"
# `import sglang` needs orjson, pybase64, pillow, ipython and aiohttp beyond radixrt's own
# packages (its frontend is pure Python): the test extras install them in this venv, which the
# throw-away venv sees, so building it is one --no-deps install (was ~50 s with them).
VENV = Path(
    os.environ.get(
        "RADIXRT_SGLANG_VENV", Path.home() / ".cache" / "radixrt" / "sglang-0.5.23-client"
    )
)
PROGRAMS = Path(__file__).with_name("sglang_client_programs.py")


def _python() -> Path:
    return VENV / "bin" / "python"


def _imports_sglang() -> bool:
    return (
        _python().exists()
        and subprocess.run([str(_python()), "-c", "import sglang"], capture_output=True).returncode
        == 0
    )


def _see_this_venvs_packages() -> None:
    """The venv sees this venv's packages (torch, transformers, requests, ...) through a .pth
    (rewritten each run: the cached venv may have been built from another checkout)."""
    purelib = subprocess.run(
        [str(_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "radixrt_test_packages.pth").write_text("\n".join(site.getsitepackages()))


def _build_venv() -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    _see_this_venvs_packages()
    pip = [str(_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", SGLANG], check=True, timeout=600)


@pytest.fixture(scope="module")
def sglang_python() -> Path:
    if _python().exists():
        with contextlib.suppress(subprocess.CalledProcessError):  # a broken one is rebuilt
            _see_this_venvs_packages()
    if not _imports_sglang():
        try:
            _build_venv()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            pytest.skip(
                f"cannot install {SGLANG} from PyPI here ({exc}); the client test "
                "needs the real wheel"
            )
    return _python()


@pytest.fixture(scope="module")
def results(sglang_python, lang_server) -> dict:
    run = subprocess.run(
        [str(sglang_python), str(PROGRAMS), lang_server.url],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, f"SGLang's client failed:\n{run.stdout}\n{run.stderr}"
    return json.loads(lines[-1][len("RESULT ") :])


def test_model_name_and_server_info(results):
    assert results["model_name"].endswith(".gguf")
    keys = set(results["server_info_keys"])
    assert {"version", "internal_states", "max_total_num_tokens"} <= keys


def test_gen_and_run_batch(results):
    assert "rome" in results["answer"].lower()
    assert len(results["batch"]) == 2 and all(isinstance(a, str) for a in results["batch"])
    assert "\n" not in results["answer"]


def test_select(results):
    assert results["select"] in ("True", "False")


def test_gen_int_and_regex(results):
    assert results["hours"].strip().isdigit()  # the 135M model may not say 24
    import re

    assert re.fullmatch(r"[0-9]{1,3}\.[0-9]{1,3}", results["ip"])


def test_fork_join_gathers_both_branches(results):
    assert len(results["colors"]) == 2 and all(isinstance(c, str) for c in results["colors"])


def test_fork_concate_and_append_joins_the_branches_text(results):
    assert results["encoded_text"].startswith("Facts:\nFact 0: item 0.\nFact 1: item 1.\nSummary:")


def test_streaming_chunks_make_the_answer(results):
    chunks = results["stream_chunks"]
    assert len(chunks) > 1
    assert "".join(chunks) in results["chat_text"]
    assert "<|im_start|>" in results["chat_text"] or "USER:" in results["chat_text"]
