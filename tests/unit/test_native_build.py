"""The native build's guard against a killed build's leftover lock (radixrt/native/build.py)."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

from radixrt.native.build import _one_builder


def test_a_stale_torch_lock_is_removed_by_the_flock_holder(tmp_path: Path) -> None:
    (tmp_path / "lock").write_text("")  # what a build killed mid-way leaves behind
    with _one_builder(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_a_second_builder_waits_for_the_first(tmp_path: Path) -> None:
    """While one process holds the flock, a live build is running: its lock is not touched."""
    entered = threading.Event()
    with open(tmp_path / "radixrt.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (tmp_path / "lock").write_text("")  # the live build's own lock

        def second() -> None:
            with _one_builder(tmp_path):
                entered.set()

        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        assert not entered.wait(0.3)
        assert (tmp_path / "lock").exists()
        (tmp_path / "lock").unlink()  # the first build ends: its lock goes, then its flock
    thread.join(10)
    assert entered.is_set()


def test_a_cpu_without_avx2_gets_the_torch_paths_with_one_warning(monkeypatch, caplog) -> None:
    """No illegal instruction on an old CPU: the kernels are not built, callers keep torch."""
    from radixrt.native import build, cpu

    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"sse2", "avx", "fma", "f16c"}))
    build.load_native.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="radixrt.native"):
            assert build.load_native() is None
        assert "this CPU lacks avx2: using torch paths" in caplog.text
    finally:
        build.load_native.cache_clear()  # the next caller finds the real kernels again


def test_the_avx2_build_is_a_build_of_its_own(monkeypatch) -> None:
    from radixrt.native import build

    sources = sorted(build.CSRC.glob("*.cpp"))
    native = build.build_key(sources)
    monkeypatch.setenv("RADIXRT_CPU_ISA", "avx2")
    assert "-mno-avx512f" in build.cflags()
    assert build.build_key(sources) != native


def test_a_finished_build_is_loaded_from_any_checkout(tmp_path: Path, monkeypatch) -> None:
    """torch's `load` rebuilds when a command line changes, and those name the checkout: a
    folder whose build finished is loaded as it is, one whose build did not is built again."""
    import torch.utils.cpp_extension

    from radixrt.native import build

    loaded: list[str] = []
    built: list[str] = []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)

    def fake_load(name: str, build_directory: str, **_: object) -> None:
        built.append(name)
        (Path(build_directory) / f"{name}.so").write_bytes(b"")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_load)
    (tmp_path / "lib.so").write_bytes(b"")  # a library without the mark: killed mid-build
    build._build_or_reuse(tmp_path, "lib", [])
    assert built == ["lib"] and loaded == []
    assert (tmp_path / "finished").exists()
    build._build_or_reuse(tmp_path, "lib", [])
    assert built == ["lib"] and loaded == [str(tmp_path / "lib.so")]
