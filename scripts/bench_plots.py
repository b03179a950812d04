"""PNG plots of the benchmark tables (matplotlib, Agg backend, imported only to plot).

    bench_serving.py --plot out.png   one row per workload: output tok/s | TTFT p50/p95/p99 |
                                      ITL p50/p95/p99, a bar per server (cache on vs off with
                                      --compare-radix-cache)
    bench_offline.py --plot out.png   tok/s | wall seconds per workload, a bar per system

Either script's --json / --output-json file can be plotted again without rerunning it:

    python scripts/bench_plots.py results.json out.png ["a title"]
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from typing import Any

PERCENTILES = ("p50", "p95", "p99")
SERVING_PANELS = (  # (summary key, panel title); a key of three values is [p50, p95, p99]
    ("output_throughput", "output tok/s (higher is better)"),
    ("ttft_ms", "TTFT ms (lower is better)"),
    ("itl_ms", "ITL ms (lower is better)"),
)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, groups: list[str], series: dict[str, list[float]]) -> None:
    """Grouped bars: one group per label of `groups`, one bar per series within it."""
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [0.0 if v is None or math.isnan(v) else v for v in values]
        bars = ax.bar(xs, heights, width, label=label)
        ax.bar_label(bars, [_label(v) for v in values], fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.margins(y=0.15)


def plot_serving(runs: dict[str, dict[str, dict]], path: str, title: str = "") -> None:
    """`runs`: server label -> workload -> bench_serving.summarize()'s dict."""
    plt = _pyplot()
    workloads = list(next(iter(runs.values())))
    fig, axes = plt.subplots(
        len(workloads), len(SERVING_PANELS), figsize=(13, 3.2 * len(workloads)), squeeze=False
    )
    for row, workload in zip(axes, workloads, strict=True):
        for ax, (key, panel) in zip(row, SERVING_PANELS, strict=True):
            if key == "output_throughput":
                series = {label: [run[workload][key]] for label, run in runs.items()}
                _bars(ax, [workload], series)
            else:
                series = {label: list(run[workload][key]) for label, run in runs.items()}
                _bars(ax, list(PERCENTILES), series)
            ax.set_title(f"{workload}: {panel}", fontsize=9)
        row[0].legend(fontsize=8)
    _save(fig, path, title)


def plot_offline(rows: list[dict], path: str, title: str = "") -> None:
    """`rows`: bench_offline.py's Row objects as dicts (its --json 'rows')."""
    plt = _pyplot()
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, key, panel in (
        (axes[0], "tok_s", "tok/s (higher is better)"),
        (axes[1], "wall_s", "wall seconds (lower is better)"),
    ):
        cells = {(r["workload"], r["system"]): r[key] for r in rows}
        series = {s: [_or_nan(cells.get((w, s))) for w in workloads] for s in systems}
        _bars(ax, [w.split(":")[0] for w in workloads], series)
        ax.set_title(panel, fontsize=9)
    axes[0].legend(fontsize=8)
    _save(fig, path, title)


def _label(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "n/a"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _or_nan(x: float | None) -> float:
    return math.nan if x is None else x


def _save(fig: Any, path: str, title: str) -> None:
    if title:
        fig.suptitle(textwrap.fill(title, 140), fontsize=9)  # a command line can be long
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        sys.exit('usage: bench_plots.py RESULTS.json OUT.png ["a title"]')
    with open(argv[0]) as f:
        results = json.load(f)
    title = argv[2] if len(argv) == 3 else results.get("command", "")
    if "runs" in results:  # bench_serving.py --output-json
        plot_serving(results["runs"], argv[1], title)
    else:  # bench_offline.py --json
        plot_offline(results["rows"], argv[1], title)


if __name__ == "__main__":
    main(sys.argv[1:])
