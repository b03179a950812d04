"""Speed on the CPU: radixrt against transformers, vLLM's CPU build and llama.cpp, on the same
seeded token-id workloads, each engine in its own process and virtual environment, one at a
time, with 2 threads each (docs/bench_cpu.md).

    python scripts/bench_cpu.py [--venvs DIR] [--engines radixrt,vllm,llamacpp,transformers]
        [--workloads decode,prefill,unrelated,shared_prefix,long] [--quick] [--model-path F.gguf]
        [--radixrt-args "--quantization none"] [--radixrt-variant NAME=ARGS ...]
        [--rounds N] [--out results.json] [--markdown table.md]

Run it with the project's venv python (the radixrt worker runs there); each peer runs with the
python of DIR/<peer>/ (made by scripts/bench_cpu_setup.sh). A peer without a venv is reported
"not installed", one whose worker fails "failed: <reason>"; neither gets a figure.

--rounds N runs every engine N times, the order reversed every other round (radixrt's variants
first, then the peers first), so that neither side always runs on a fresher or warmer machine;
each workload's figure is the median of its N times. Below the tok/s rows, three load rows
(lower is better; bench_common.LOAD_FIGURES): seconds from the constructor to its return, ready
for a request, and the engine's processes' resident memory then and after the last workload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_common as bc
from bench_llamacpp_batch import context_cells

from radixrt.native.cpu import cpu_flags

WORKERS = Path(__file__).with_name("bench_cpu_workers.py")
PEERS = ("vllm", "llamacpp", "transformers")
ENGINES = ("radixrt", *PEERS)
PEER_LABELS = {"vllm": "vLLM", "llamacpp": "llama.cpp", "transformers": "transformers"}
DEFAULT_VENVS = os.environ.get(
    "RADIXRT_BENCH_VENVS", str(Path.home() / ".cache" / "radixrt-bench" / "venvs")
)
THREADS = 2
# Every engine's KV cache budget, GiB: vLLM's VLLM_CPU_KVCACHE_SPACE, radixrt's
# cpu_kv_cache_gb (1 GiB by default, which holds ~23,000 float32 tokens of the default model,
# fewer than the long workload's 8 x 4,064).
KV_CACHE_GIB = 4  # vLLM's; radixrt's pool holds llama.cpp's largest context (context_tokens)
KERNEL_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile"})
TOKEN_RANGE = (100, 40000)
# Environment for every worker: 2 threads, nothing downloaded, vLLM's CPU build pinned to the
# same 2 cores with a bounded KV cache (GiB).
WORKER_ENV = {
    "OMP_NUM_THREADS": str(THREADS),
    "MKL_NUM_THREADS": str(THREADS),
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": f"0-{THREADS - 1}",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[list[int]]
    shared_prefix: int
    new_tokens: int
    counts: str  # "output" or "prompt": which tokens its tok/s counts

    @property
    def title(self) -> str:
        shared = f" ({self.shared_prefix} shared)" if self.shared_prefix else ""
        n, length = len(self.prompts), len(self.prompts[0])
        return f"{self.name}: {n} × {length}{shared}, {self.new_tokens} new"

    def counted_tokens(self) -> int:
        if self.counts == "prompt":
            return sum(len(p) for p in self.prompts)
        return self.new_tokens * len(self.prompts)


# name -> ((prompts, prompt length, shared prefix length, new tokens) full size, the same
# under --quick, which tokens its tok/s counts).
SHAPES: dict[str, tuple[tuple[int, int, int, int], tuple[int, int, int, int], str]] = {
    "decode": ((1, 16, 0, 256), (1, 16, 0, 16), "output"),
    "prefill": ((1, 2000, 0, 1), (1, 200, 0, 1), "prompt"),
    "unrelated": ((64, 128, 0, 128), (4, 32, 0, 8), "output"),
    "shared_prefix": ((64, 1016, 1000, 32), (4, 116, 100, 4), "output"),
    "long": ((8, 4000, 0, 64), (2, 400, 0, 4), "output"),
}


def build_workloads(names: list[str], quick: bool, seed: int = 0) -> list[Workload]:
    """Seeded token ids in TOKEN_RANGE; each workload draws from its own generator, so picking
    a subset changes none of them."""
    out = []
    for name in names:
        full, small, counts = SHAPES[name]
        n, length, prefix_len, new = small if quick else full
        rng = random.Random(f"{seed}:{name}")
        prefix = [rng.randrange(*TOKEN_RANGE) for _ in range(prefix_len)]
        prompts = [
            prefix + [rng.randrange(*TOKEN_RANGE) for _ in range(length - prefix_len)]
            for _ in range(n)
        ]
        out.append(Workload(name, prompts, prefix_len, new, counts))
    return out


def parse_engine_args(text: str) -> dict[str, Any]:
    """'--quantization none --enable-torch-compile' -> {'quantization': 'none',
    'enable_torch_compile': True}: Engine keyword arguments in the CLI's spelling."""
    words, kwargs = shlex.split(text), {}
    i = 0
    while i < len(words):
        if not words[i].startswith("--"):
            raise SystemExit(f"--radixrt-args: expected --flag, got {words[i]!r}")
        key = words[i][2:].replace("-", "_")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            kwargs[key] = _scalar(words[i + 1])
            i += 2
        else:
            kwargs[key] = True
            i += 1
    return kwargs


def _scalar(word: str) -> Any:
    for cast in (int, float):
        try:
            return cast(word)
        except ValueError:
            pass
    return word


def radixrt_variants(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    if not args.radixrt_variant:
        label = f"radixrt ({args.radixrt_args})" if args.radixrt_args else "radixrt"
        return [(label, parse_engine_args(args.radixrt_args))]
    variants = []
    for item in args.radixrt_variant:
        name, sep, flags = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--radixrt-variant: expected NAME=ARGS, got {item!r}")
        variants.append((f"radixrt ({name})", parse_engine_args(flags)))
    return variants


def default_gguf() -> str:
    from radixrt.loader.default_model import default_model_path

    return str(default_model_path())


def ensure_hf_dir(gguf: str, venvs: Path) -> Path:
    """The float32 HF folder vLLM and transformers load, dequantized once from the GGUF. Named
    by the file and its folder: scripts/gguf_variants.py names each model's files by type alone
    (Q4_K_M.gguf), in one folder per model."""
    path = Path(gguf).resolve()
    out = venvs / "hf-models" / f"{path.parent.name}-{path.stem}"
    if not (out / "config.json").exists():
        print(f"dequantizing {gguf} into {out} (once)", file=sys.stderr)
        cmd = [sys.executable, str(WORKERS), "convert", gguf, str(out)]
        subprocess.run(cmd, check=True, env={**os.environ, **WORKER_ENV})
    return out


def run_worker(python: str, engine: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One engine in its own process; {'error': ...} instead of figures when it fails."""
    return run_json_worker([python, str(WORKERS), engine], spec, timeout)


def run_json_worker(cmd: list[str], spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """`cmd SPEC.json RESULT.json` in the workers' environment: the JSON it wrote, or
    {'error': ...} (with 'crashed' when a signal killed it)."""
    if not Path(cmd[0]).exists():
        return {"error": "not installed"}
    with tempfile.TemporaryDirectory(prefix="bench_worker_") as tmp:
        spec_path, result_path = Path(tmp, "spec.json"), Path(tmp, "result.json")
        spec_path.write_text(json.dumps(spec))
        try:
            proc = subprocess.run(
                [*cmd, str(spec_path), str(result_path)],
                env={**os.environ, **WORKER_ENV},
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"failed: over {timeout:.0f} s"}
        if proc.returncode < 0:  # a crash: nothing useful on stderr
            return {"error": f"failed: killed by signal {-proc.returncode}", "crashed": True}
        if proc.returncode != 0 or not result_path.exists():
            return {"error": f"failed: {last_error_line(proc.stderr)}"}
        return json.loads(result_path.read_text())


def radixrt_job(spec: dict[str, Any], flags: dict[str, Any], timeout: float):
    return lambda: run_worker(sys.executable, "radixrt", {**spec, "engine_args": flags}, timeout)


def peer_job(peer: str, venvs: Path, spec: dict[str, Any], args: argparse.Namespace):
    engine_args = {"dtype": args.vllm_dtype} if peer == "vllm" else {}
    python = str(venvs / peer / "bin" / "python")

    def job() -> dict[str, Any]:
        result = run_worker(python, peer, {**spec, "engine_args": engine_args}, args.timeout)
        if peer == "llamacpp" and result.get("crashed"):
            # llama.cpp 0.3.36's repacked (AMX) weights segfault on multi-token batches on
            # some AMX CPUs; its plain CPU kernels are what a user there can run.
            print("llama.cpp crashed; again without its extra weight buffers", file=sys.stderr)
            spec_plain = {**spec, "engine_args": {"extra_bufts": False}}
            result = run_worker(python, peer, spec_plain, args.timeout)
        return result

    return job


def round_orders(jobs: list, rounds: int) -> list[list]:
    """The jobs' order in each round: as given, then reversed, alternately."""
    return [list(jobs) if r % 2 == 0 else list(reversed(jobs)) for r in range(rounds)]


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's rounds as one result: the first round's, with each workload's seconds the
    median over the rounds (every round's in `seconds_each`), the load figures likewise; the
    first failure if any."""
    failed = [r for r in runs if "error" in r]
    if failed or len(runs) == 1:
        return (failed or runs)[0]
    merged = {**runs[0], **bc.median_load(runs), "workloads": {}}
    for name, figures in runs[0]["workloads"].items():
        each = [r["workloads"][name]["seconds"] for r in runs]
        merged["workloads"][name] = {
            **figures,
            "seconds": statistics.median(each),
            "seconds_each": each,
        }
    return merged


def last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or ["no output"])[-1][:200]


def tok_s(result: dict[str, Any], w: Workload) -> float | None:
    figures = result.get("workloads", {}).get(w.name)
    return w.counted_tokens() / figures["seconds"] if figures else None


def hit_rates(results: dict[str, dict[str, Any]], w: Workload) -> str:
    """The share of prompt tokens each engine served from its prefix cache, where it says."""
    rates = []
    for label, result in results.items():
        figures = result.get("workloads", {}).get(w.name)
        if figures and figures["cached_tokens"] is not None:
            share = figures["cached_tokens"] / max(1, figures["prompt_tokens"])
            rates.append(f"{label} {100 * share:.0f}%")
    return ", ".join(rates) or "—"


def cell(result: dict[str, Any], w: Workload) -> str:
    if "error" in result:
        return result["error"]
    rate = tok_s(result, w)
    return "—" if rate is None else f"{rate:,.1f}"


def ratio(ours: dict[str, Any], peer: dict[str, Any], w: Workload) -> str:
    a, b = tok_s(ours, w), tok_s(peer, w)
    return f"{a / b:.2f}×" if a and b else "—"


def markdown_table(
    workloads: list[Workload], results: dict[str, dict[str, Any]], ours: list[str]
) -> str:
    """One row per workload: tok/s per engine, the cache hit rates, then radixrt ÷ peer for
    each radixrt variant and each peer; then the load figures' rows, the same way."""
    peers = [label for label in results if label not in ours]
    pairs = [(o, p) for o in ours for p in peers]
    head = ["workload", "counts", *results, "prompt tokens from cache"]
    head += [f"{o} ÷ {p}" for o, p in pairs]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in workloads:
        row = [w.title, f"{w.counts} tok/s"]
        row += [cell(r, w) for r in results.values()]
        row.append(hit_rates(results, w))
        row += [ratio(results[o], results[p], w) for o, p in pairs]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows + bc.load_rows(results, pairs))


def cpu_model() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown CPU"


def header(results: dict[str, dict[str, Any]], quick: bool) -> str:
    """The CPU (its name and the flags that choose the kernels), threads, engines' versions."""
    flags = " ".join(sorted(KERNEL_FLAGS & cpu_flags())) or "no AVX2"
    cpu = f"{cpu_model()} ({os.cpu_count()} logical CPUs; {flags})"
    engines = [
        f"- {k}: {r['version']}, {r['dtype']}" for k, r in results.items() if "error" not in r
    ]
    return "\n".join([f"CPU: {cpu}, {THREADS} threads per engine" + (" — QUICK" * quick), *engines])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--venvs", default=DEFAULT_VENVS, help="folder with vllm/ llamacpp/ ...")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--workloads", default=",".join(SHAPES))
    p.add_argument("--quick", action="store_true", help="shrink every workload (smoke run)")
    p.add_argument(
        "--model-path",
        "--gguf",
        help="any GGUF file, e.g. from scripts/gguf_variants.py (default: radixrt's default "
        "model); vLLM and transformers run its dequantized float32 copy",
    )
    p.add_argument("--radixrt-args", default="", help="Engine flags, e.g. '--quantization none'")
    p.add_argument("--radixrt-variant", action="append", metavar="NAME=ARGS")
    p.add_argument("--vllm-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--timeout", type=float, default=3600, help="seconds per engine")
    p.add_argument("--rounds", type=int, default=1, help="runs per engine, order alternating")
    p.add_argument("--out", help="write every figure as JSON")
    p.add_argument("--markdown", help="write the header and table as markdown")
    args = p.parse_args(argv)
    for field, allowed in (("engines", ENGINES), ("workloads", tuple(SHAPES))):
        bad = set(getattr(args, field).split(",")) - set(allowed)
        if bad:
            p.error(f"--{field}: unknown {sorted(bad)}; allowed: {','.join(allowed)}")
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    engines = args.engines.split(",")
    workloads = build_workloads(args.workloads.split(","), args.quick)
    gguf = args.model_path or default_gguf()
    venvs = Path(args.venvs).expanduser()
    longest = max(len(p) for w in workloads for p in w.prompts)
    spec: dict[str, Any] = {
        "gguf": gguf,
        "threads": THREADS,
        "kv_cache_gib": KV_CACHE_GIB,
        "context_tokens": max(context_cells(w.prompts, w.new_tokens) for w in workloads),
        "max_len": max(4096, longest + 128),
        "warmup": [random.Random(99).randrange(*TOKEN_RANGE) for _ in range(8)],
        "workloads": [
            {"name": w.name, "prompts": w.prompts, "new_tokens": w.new_tokens} for w in workloads
        ],
    }
    if {"vllm", "transformers"} & set(engines):
        spec["hf_dir"] = str(ensure_hf_dir(gguf, venvs))
    variants = radixrt_variants(args) if "radixrt" in engines else []
    jobs = [(label, radixrt_job(spec, flags, args.timeout)) for label, flags in variants]
    jobs += [
        (PEER_LABELS[peer], peer_job(peer, venvs, spec, args)) for peer in PEERS if peer in engines
    ]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in jobs}
    for order in round_orders(jobs, args.rounds):
        for label, job in order:  # one engine at a time: never two on the CPU at once
            print(f"running {label}", file=sys.stderr)
            runs[label].append(job())
    results = {label: median_result(rs) for label, rs in runs.items()}
    ours = [label for label, _ in variants]
    text = header(results, args.quick) + "\n\n" + markdown_table(workloads, results, ours)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    report = {
        "cpu": cpu_model(),
        "threads": THREADS,
        "quick": args.quick,
        "rounds": args.rounds,
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
