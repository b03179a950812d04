"""scripts/bench_cpu.py: its workloads, its table and ratios (tok/s, then the load figures),
the resident memory of a process tree, and one real shrunk run of the radixrt worker beside a
peer whose venv is missing (reported, never given a figure)."""

from __future__ import annotations

import os
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import bench_cpu  # noqa: E402


def test_workloads_are_seeded_sized_and_independent_of_the_selection():
    full = bench_cpu.build_workloads(list(bench_cpu.SHAPES), quick=False)
    again = bench_cpu.build_workloads(["long", "shared_prefix"], quick=False)
    by_name = {w.name: w for w in full}
    assert [w.prompts for w in again] == [by_name["long"].prompts, by_name["shared_prefix"].prompts]
    sizes = {w.name: (len(w.prompts), len(w.prompts[0]), w.new_tokens) for w in full}
    assert sizes == {
        "decode": (1, 16, 256),
        "prefill": (1, 2000, 1),
        "unrelated": (64, 128, 128),
        "shared_prefix": (64, 1016, 32),
        "long": (8, 4000, 64),
    }
    shared = by_name["shared_prefix"].prompts
    assert all(p[:1000] == shared[0][:1000] for p in shared)
    assert len({tuple(p[1000:]) for p in shared}) == 64
    unrelated = by_name["unrelated"].prompts
    assert len({p[0] for p in unrelated}) > 32  # not one prompt repeated
    low, high = bench_cpu.TOKEN_RANGE
    assert all(low <= t < high for w in full for p in w.prompts for t in p)


def test_the_table_counts_the_right_tokens_and_divides_the_right_way():
    decode, prefill = bench_cpu.build_workloads(["decode", "prefill"], quick=False)
    ours = {"workloads": {"decode": _fig(2.0, 0), "prefill": _fig(4.0, 0)}}
    peer = {"workloads": {"decode": _fig(8.0, None), "prefill": _fig(2.0, 1000)}}
    results = {"radixrt": ours, "llama.cpp": peer, "vLLM": {"error": "not installed"}}
    table = bench_cpu.markdown_table([decode, prefill], results, ["radixrt"])
    rows = table.splitlines()
    assert rows[0].split(" | ")[-2:] == ["radixrt ÷ llama.cpp", "radixrt ÷ vLLM |"]
    assert "| 128.0 | 32.0 | not installed |" in rows[2]  # 256 tokens in 2 s and in 8 s
    assert "4.00×" in rows[2] and rows[2].endswith("| — |")
    assert "prompt tok/s | 500.0 | 1,000.0 |" in rows[3]  # the prefill counts its 2,000
    assert "0.50×" in rows[3] and "llama.cpp 50%" in rows[3]


def test_the_load_rows_follow_with_radixrt_over_the_peer_lower_better():
    (decode,) = bench_cpu.build_workloads(["decode"], quick=True)
    load = {"ready_s": 1.5, "rss_load_mib": 600.0, "rss_end_mib": 1200.0, "pss_end_mib": 900.0}
    ours = {"workloads": {"decode": _fig(2.0, 0)}, **load}
    peer = {"workloads": {"decode": _fig(8.0, None)}, "ready_s": 3.0, "rss_load_mib": 2400.0}
    peer["pss_end_mib"] = 450.0
    results = {"radixrt": ours, "llama.cpp": peer, "vLLM": {"error": "not installed"}}
    rows = bench_cpu.markdown_table([decode], results, ["radixrt"]).splitlines()
    assert len(rows) == 2 + 1 + 5
    ready, rss_load, rss_end, pss_load, pss_end = rows[3:]
    assert pss_load.startswith("| PSS after load (MiB) |")
    assert "| — | — | not installed |" in pss_load
    assert "| 900 | 450 | not installed | — | 2.00× | — |" in pss_end
    assert (
        ready == "| ready (s) | s, lower is better | 1.50 | 3.00 | not installed | — | 0.50× | — |"
    )
    assert rss_load.startswith("| resident memory after load (MiB) | MiB, lower is better |")
    assert "| 600 | 2,400 | not installed | — | 0.25× | — |" in rss_load
    assert "| 1,200 | — | not installed | — | — | — |" in rss_end  # the peer gave none


def test_rounds_take_the_median_of_the_load_figures_too():
    runs = [
        {"workloads": {}, "ready_s": s, "rss_load_mib": m, "rss_end_mib": m + 1}
        for s, m in ((3.0, 500.0), (1.0, 700.0), (2.0, 600.0))
    ]
    merged = bench_cpu.median_result(runs)
    assert merged["ready_s"] == 2.0 and merged["ready_s_each"] == [3.0, 1.0, 2.0]
    assert merged["rss_load_mib"] == 600.0 and merged["rss_end_mib"] == 601.0


def test_resident_memory_counts_the_child_processes():
    import subprocess

    import bench_cpu_workers

    alone = bench_cpu_workers.tree_rss_mib()
    hold = 'x = b"x" * (64 << 20); print(flush=True); input()'
    child = subprocess.Popen(
        [sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        child.stdout.readline()  # its 64 MiB are touched
        assert bench_cpu_workers.tree_rss_mib() > alone + 64
    finally:
        child.communicate("")


def _fig(seconds: float, cached: int | None) -> dict:
    return {"seconds": seconds, "cached_tokens": cached, "prompt_tokens": 2000}


def test_engine_args_parse_as_the_cli_spells_them():
    got = bench_cpu.parse_engine_args("--quantization none --enable-torch-compile --page-size 16")
    assert got == {"quantization": "none", "enable_torch_compile": True, "page_size": 16}
    with pytest.raises(SystemExit, match="expected --flag"):
        bench_cpu.parse_engine_args("none")


def test_unknown_engines_are_refused_with_the_allowed_names(capsys):
    with pytest.raises(SystemExit):
        bench_cpu.parse_args(["--engines", "radixrt,ollama"])
    assert "allowed: radixrt,vllm,llamacpp,transformers" in capsys.readouterr().err


@pytest.mark.default_model
def test_rounds_alternate_the_order_and_report_the_median(monkeypatch, tmp_path):
    calls = []

    def fake_worker(python, engine, spec, timeout):
        calls.append(engine)
        seconds = {"radixrt": [1.0, 3.0, 2.0], "vllm": [5.0, 4.0, 6.0]}[engine]
        figure = seconds[sum(c == engine for c in calls) - 1]
        figures = {"seconds": figure, "cached_tokens": 0, "prompt_tokens": 8}
        return {"version": "x", "dtype": "bf16", "workloads": {"decode": figures}}

    monkeypatch.setattr(bench_cpu, "run_worker", fake_worker)
    monkeypatch.setattr(bench_cpu, "ensure_hf_dir", lambda gguf, venvs: tmp_path)
    report = bench_cpu.main(
        ["--quick", "--engines", "radixrt,vllm", "--workloads", "decode", "--rounds", "3",
         "--venvs", str(tmp_path)]
    )  # fmt: skip
    assert calls == ["radixrt", "vllm", "vllm", "radixrt", "radixrt", "vllm"]
    ours = report["results"]["radixrt"]["workloads"]["decode"]
    assert ours["seconds"] == 2.0 and ours["seconds_each"] == [1.0, 3.0, 2.0]
    assert report["results"]["vLLM"]["workloads"]["decode"]["seconds"] == 5.0
    with pytest.raises(SystemExit):
        bench_cpu.parse_args(["--rounds", "0"])


@pytest.mark.default_model
def test_a_quick_run_measures_radixrt_and_reports_a_missing_peer(tmp_path):
    report = bench_cpu.main(
        ["--quick", "--engines", "radixrt,llamacpp", "--workloads", "decode,shared_prefix",
         "--venvs", str(tmp_path), "--markdown", str(tmp_path / "t.md")]
    )  # fmt: skip
    ours = report["results"]["radixrt"]
    assert ours["workloads"]["decode"]["seconds"] > 0
    assert ours["ready_s"] > 0 and ours["rss_load_mib"] > 0 and ours["rss_end_mib"] > 0
    shared = ours["workloads"]["shared_prefix"]
    assert shared["cached_tokens"] >= 3 * 100  # the other three prompts hit the 100 shared
    assert "not installed" in report["results"]["llama.cpp"]["error"]
    assert "not installed" in (tmp_path / "t.md").read_text()


@pytest.mark.slow  # times both kernels
def test_attention_benchmark_checks_then_times_both_kernels(capsys):
    import bench_cpu_attention

    if bench_cpu_attention.load_native() is None:
        pytest.skip("native CPU kernels unavailable (no compiler/ninja, or disabled)")
    argv = ["bench_cpu_attention.py", "--prefill", "40", "--context", "70", "--seconds", "0"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        bench_cpu_attention.main()
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if " | float32 | " in line or " | bfloat16 | " in line]
    names = [row.split(" | ")[0] for row in rows]
    assert (
        names
        == ["| prefill 40"] * 2
        + ["| 16 x 5 new after 70"] * 2
        + ["| decode 64 x 70"] * 2
        + ["| 70 shared + 30 own"] * 2
    )
    for row in rows:  # kernel and reference (SDPA, or the per-sequence prefix) ms, and ratio
        native_ms, sdpa_ms, ratio = (float(c.strip(" |x")) for c in row.split(" | ")[2:5])
        assert native_ms > 0 and sdpa_ms > 0 and ratio > 0  # ms are rounded: ratio is not exact
