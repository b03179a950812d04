"""radixrt's native CPU kernels: every native/csrc/*.cpp, compiled into one library on first use.

Each source registers its ops itself with `TORCH_LIBRARY_FRAGMENT(radixrt, m)` (schema) and
`TORCH_LIBRARY_IMPL(radixrt, CPU, m)` (kernel); loading the library makes them callable as
`torch.ops.radixrt.<name>`. A new kernel is a new .cpp file here: nothing to list anywhere.

The build uses -O3 -march=native -fopenmp, so it goes to a directory keyed by the sources, the
torch version and this CPU's flags (~/.cache/radixrt/native-<key>): a binary is never reused on
another CPU or torch, and a second process reuses the first one's build. Without a compiler or
ninja, or when the build fails, `load_native()` logs one warning and returns None, and callers
keep their pure-torch paths; RADIXRT_DISABLE_NATIVE=1 forces that. So does a CPU without
AVX2, FMA and F16C (said once, in a warning). RADIXRT_CPU_ISA=avx2 builds the kernels' AVX2
paths on a CPU with AVX-512 (native/cpu.py), into a folder of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from radixrt.native.cpu import BASELINE, forced_isa, isa_cflags, missing_baseline

logger = logging.getLogger("radixrt.native")

CSRC = Path(__file__).parent / "csrc"
DISABLE_ENV = "RADIXRT_DISABLE_NATIVE"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++20"]


def cflags() -> list[str]:
    """CFLAGS and the instruction sets RADIXRT_CPU_ISA chooses (native/cpu.py)."""
    return CFLAGS + isa_cflags()


def native_disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") not in ("", "0")


@functools.cache
def load_native() -> Any | None:
    """The native kernels' ops (`NativeOps`: torch.ops.radixrt's default overloads), or None
    (see module docstring). Built, or found already built, once per process."""
    if native_disabled():
        logger.info("native CPU kernels disabled by %s", DISABLE_ENV)
        return None
    missing = missing_baseline()
    if missing:  # compiled for this CPU they would have no vector paths worth their build
        logger.warning(
            "native CPU kernels need %s; this CPU lacks %s: using torch paths (slow)",
            "+".join(BASELINE), ", ".join(missing),
        )  # fmt: skip
        return None
    _put_pip_ninja_on_path()
    missing = [tool for tool in ("ninja", _compiler()) if shutil.which(tool) is None]
    if missing:
        logger.warning("native CPU kernels unavailable (not found: %s)", ", ".join(missing))
        return None
    sources = sorted(CSRC.glob("*.cpp"))
    key = build_key(sources)
    build_dir = Path.home() / ".cache" / "radixrt" / f"native-{key}"
    start = time.perf_counter()
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        with _one_builder(build_dir):
            _build_or_reuse(build_dir, f"radixrt_native_{key}", sources)
    except Exception as exc:  # a compiler error, a missing header: fall back, say why once
        logger.warning("native CPU kernels failed to build, using torch paths: %s", exc)
        return None
    logger.info(
        "native CPU kernels ready in %.1f s (%s, %s paths)",
        time.perf_counter() - start, build_dir, forced_isa(),
    )  # fmt: skip
    return NativeOps()


def _build_or_reuse(build_dir: Path, name: str, sources: list[Path]) -> None:
    """Load the library this folder already holds, or build it there.

    The folder's key covers everything the binary depends on, so a finished build is loaded
    as it is. torch's `load` would compare the build's command lines instead, and those name
    the checkout and the venv: from another checkout (a fresh clone, CI) it rebuilt the same
    sources for about a minute."""
    library, finished = build_dir / f"{name}.so", build_dir / "finished"
    if library.exists() and finished.exists():
        torch.ops.load_library(str(library))
        return
    from torch.utils.cpp_extension import load

    load(
        name=name,
        sources=[str(s) for s in sources],
        extra_cflags=cflags(),
        extra_ldflags=["-fopenmp"],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )
    finished.touch()  # written last: a build killed before this point is redone


@contextlib.contextmanager
def _one_builder(build_dir: Path) -> Iterator[None]:
    """Hold an flock on the build folder while torch builds or loads there.

    torch's own guard is a `lock` file that a killed build leaves behind, after which every
    later process waits on it forever. An flock dies with its holder, so whoever holds it
    knows no live radixrt build is running there, and a `lock` file it finds is stale."""
    with open(build_dir / "radixrt.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            logger.warning("removing a stale build lock left by a killed build: %s", stale)
            stale.unlink(missing_ok=True)
        yield


class NativeOps:
    """`torch.ops.radixrt`, but each name gives the op's default overload: calling the op
    packet resolves the overload on every call, which cost 2.5x the dispatch of the overload
    itself (14 against 6 us here; a batch-1 step makes ~300 such calls)."""

    def __getattr__(self, name: str) -> Any:
        op = getattr(torch.ops.radixrt, name).default
        setattr(self, name, op)  # found once, then a plain attribute
        return op


def _put_pip_ninja_on_path() -> None:
    # The `ninja` dependency installs its binary into the venv's bin/, which is not on PATH
    # when the venv's python is run without activating it (as `make test` does).
    try:
        import ninja
    except ImportError:
        return
    bin_dir = str(ninja.BIN_DIR)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def build_key(sources: list[Path]) -> str:
    """Hash of what the binary depends on: the sources and headers, torch, the compile flags
    and the CPU (its model and instruction-set flags, since -march=native follows them)."""
    digest = hashlib.sha256()
    for path in sorted(sources + list(CSRC.glob("*.h"))):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(platform.python_version().encode())
    digest.update(" ".join(cflags()).encode())
    digest.update(_cpu_signature().encode())
    return digest.hexdigest()[:16]


def _cpu_signature() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")  # x86 and ARM spellings
    lines = {line.split(":")[0].strip(): line for line in info.splitlines() if ":" in line}
    return platform.machine() + "".join(lines.get(k, "") for k in wanted)
