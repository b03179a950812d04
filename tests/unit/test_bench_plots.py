"""scripts/bench_plots.py on small made-up result tables: valid PNGs with a bar colour per
server or system. No benchmark runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import bench_plots  # noqa: E402

pytestmark = pytest.mark.slow  # matplotlib renders each plot

# matplotlib's first two default colours: the first and second bar series.
C0, C1 = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)


def summary(scale: float) -> dict:
    """A bench_serving.summarize()-shaped dict."""
    return {
        "completed": 8,
        "failed": 0,
        "duration_s": 2.0 * scale,
        "request_throughput": 4.0 / scale,
        "output_throughput": 120.0 / scale,
        "ttft_ms": [100 * scale, 150 * scale, 180 * scale],
        "tpot_ms": [20.0, 25.0, 30.0],
        "itl_ms": [18.0, 24.0, float("nan")],  # a missing percentile must not break the plot
        "e2e_ms": [700.0, 800.0, 900.0],
        "cache_hit_rate": 0.9,
    }


def colours_of(path: Path) -> set[tuple[int, int, int]]:
    with Image.open(path) as img:
        return {colour for _, colour in img.convert("RGB").getcolors(maxcolors=1 << 24)}


def assert_png_with_colours(path: Path, colours: list[tuple[int, int, int]]) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        assert img.width > 800 and img.height > 300
    pixels = colours_of(path)
    for colour in colours:
        assert colour in pixels, f"no bar of colour {colour}"


def test_serving_plot_has_cache_on_and_off_bars(tmp_path):
    runs = {
        "radix cache on": {"shared-prefix": summary(1.0), "skewed": summary(1.0)},
        "radix cache off": {"shared-prefix": summary(4.0), "skewed": summary(1.1)},
    }
    out = tmp_path / "serving.png"
    bench_plots.plot_serving(runs, str(out), "a title")
    assert_png_with_colours(out, [C0, C1])
    with Image.open(out) as img:
        assert img.height > 500, "one row of panels per workload"


def test_serving_plot_of_one_server_has_one_colour(tmp_path):
    out = tmp_path / "one.png"
    bench_plots.plot_serving({"radixrt": {"skewed": summary(1.0)}}, str(out))
    assert_png_with_colours(out, [C0])
    assert C1 not in colours_of(out)


def offline_rows() -> list[dict]:
    rows = []
    for workload, speed in (("a: shared 5-shot prefix", 3.0), ("decode: batch 1", 1.2)):
        for system, factor in (("radixrt", speed), ("transformers generate (static)", 1.0)):
            rows.append(
                {
                    "workload": workload,
                    "system": system,
                    "tok_s": 100 * factor,
                    "wall_s": 10 / factor,
                }
            )
    rows.append(
        {
            "workload": "a: shared 5-shot prefix",
            "system": "transformers continuous batching",
            "tok_s": None,
            "wall_s": None,
        }
    )  # a baseline that failed: n/a
    return rows


def test_offline_plot_has_a_bar_per_system(tmp_path):
    out = tmp_path / "offline.png"
    bench_plots.plot_offline(offline_rows(), str(out), "python scripts/bench_offline.py")
    assert_png_with_colours(out, [C0, C1])


@pytest.mark.parametrize("kind", ["serving", "offline"])
def test_a_json_results_file_can_be_plotted_again(tmp_path, kind):
    results = (
        {"args": {}, "runs": {"radixrt": {"skewed": summary(1.0)}}}
        if kind == "serving"
        else {"command": "x", "rows": offline_rows()}
    )
    (tmp_path / "r.json").write_text(json.dumps(results))
    out = tmp_path / "again.png"
    title = ["a title given on the command line"] if kind == "serving" else []
    subprocess.run(
        [
            sys.executable,
            os.path.join(SCRIPTS, "bench_plots.py"),
            str(tmp_path / "r.json"),
            str(out),
            *title,
        ],
        check=True,
        timeout=120,
    )
    assert_png_with_colours(out, [C0])


def test_the_serving_script_imports_matplotlib_only_to_plot():
    code = "import bench_serving, sys; print('matplotlib' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=SCRIPTS, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "False", out.stderr
