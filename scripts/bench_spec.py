"""N-gram speculative decoding on the CPU: radixrt with and without it, and llama.cpp without
and with its prompt-lookup decoding, on chat workloads whose answers repeat their context and
on random token ids where nothing matches; batch 1 and batch 16.

    python scripts/bench_spec.py [--engines radixrt,llamacpp] [--batches 1,16]
        [--workloads code_rewrite,extraction,quote,multi_turn,random] [--quick] [--dry]
        [--model-path F.gguf] [--max-new-tokens 256] [--requests 4] [--rounds N]
        [--spec-args "--speculative-algorithm NGRAM ..."] [--radixrt-args "..."]
        [--lookup-tokens 10] [--lookup-ngram 2] [--venvs DIR] [--out f.json]

Run it with the project's venv python. Each engine runs in its own process, one after the
other, with 2 threads (as scripts/bench_cpu.py, whose helpers it uses); llama.cpp from
--venvs DIR/llamacpp. The workloads (scripts/bench_spec_workloads.py) are the same token ids
for every engine: chat messages rendered with the model's chat template. Greedy; the repeating
workloads stop at EOS or --max-new-tokens, the random one ignores EOS.

- batch 1: --requests requests, one generate call after the other; batch 16: 16 variants in
  one generate call. llama.cpp's Python API runs one sequence at a time: its batch-16 row is
  its 16 requests one after the other.
- random: greedy with repetition_penalty 1.2 (radixrt's, SGLang's rule; llama.cpp's
  repeat_penalty over its last 64 tokens): without it the output loops and speculation
  matches the loop.
- extraction is constrained by its JSON schema: radixrt's `json_schema` sampling param,
  llama.cpp's grammar from the same schema (LlamaGrammar.from_json_schema).
- Before the timed runs, each engine serves warm-up requests of 16 new tokens: a repeated
  random sequence (so speculation has something to match), the longest prompt of the runs,
  and the repeated sequence under the JSON schema if a run uses one.
  radixrt's prefix cache is flushed before each run, llama.cpp's context reset.
- tok/s: output tokens (each engine's own, EOS included where it stopped there) / wall
  seconds of the generate calls. accept length: the mean of radixrt's meta_info
  `spec_accept_length` (completion tokens / verify steps). spec ≠ base: requests whose greedy
  tokens with speculation differ from those without: 0 in float32 (--radixrt-args "--dtype
  float32"); in bfloat16, the CPU's default, a verification's rows run other kernels than a
  decode's and round differently, so greedy text may part at a near-tie. context match: the share
  of output tokens (radixrt's without speculation, else the first engine's that ran) whose 3
  preceding tokens occur in the prompt: how much the answers copy their context (the small
  default model copies only part of the code file).
- --dry prints the workloads and each engine's arguments and runs nothing. --spec-args ""
  runs the "spec" engine without speculation (to check this script before the engine has it).
  --engines takes radixrt and llamacpp (each both its runs) or single runs: radixrt-base,
  radixrt-spec, llamacpp-base, llamacpp-lookup.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_cpu as bcpu
import bench_cpu_workers as bw
import bench_spec_workloads as wl

THREADS = bcpu.THREADS
SPEC_ARGS = (
    "--speculative-algorithm NGRAM --speculative-num-draft-tokens 12 "
    "--speculative-ngram-min-match-window-size 1 --speculative-ngram-max-match-window-size 12"
)
JOBS = ("radixrt-base", "radixrt-spec", "llamacpp-base", "llamacpp-lookup")
GROUPS = {"radixrt": JOBS[:2], "llamacpp": JOBS[2:]}


# -- the workers: each runs in its engine's venv, so only the standard library at the top --------
def radixrt_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import radixrt

    start = time.perf_counter()
    engine = radixrt.Engine(
        model_path=spec["gguf"],
        device="cpu",
        log_level="warning",
        num_threads=spec["threads"],
        **spec["engine_args"],
    )
    load = bw.ready(start)

    def call(prompts: list[list[int]], params: dict[str, Any]) -> list[dict[str, Any]]:
        if len(prompts) == 1:
            outs = [engine.generate(input_ids=prompts[0], sampling_params=params)]
        else:
            outs = engine.generate(input_ids=prompts, sampling_params=[params] * len(prompts))
        return [{"ids": o["output_ids"], **spec_meta(o["meta_info"])} for o in outs]

    try:
        runs = time_runs(spec, call, reset=engine.flush_cache)
    finally:
        engine.shutdown()
    return {"version": radixrt.__version__, **load, "runs": runs}


def spec_meta(meta: dict[str, Any]) -> dict[str, Any]:
    keys = ("completion_tokens", "spec_accept_length", "spec_verify_ct")
    keys += ("spec_num_proposed_drafts", "spec_num_correct_drafts")
    return {k: meta[k] for k in keys if k in meta}


def llamacpp_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    if not spec["engine_args"].get("extra_bufts", True):
        bw._without_extra_buffers(llama_cpp)
    lookup = spec["engine_args"].get("lookup")
    draft = LlamaPromptLookupDecoding(*lookup) if lookup else None
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=spec["gguf"],
        n_ctx=spec["n_ctx"],
        n_batch=512,
        n_threads=spec["threads"],
        n_threads_batch=spec["threads"],
        seed=0,
        verbose=False,
        draft_model=draft,
        # Verifying a draft reads every row's logits: a draft model turns logits_all on inside
        # Llama, but 0.3.36 sizes its logits buffer from this argument.
        logits_all=draft is not None,
    )
    load = bw.ready(start)
    grammars: dict[str, Any] = {}

    def one(prompt: list[int], params: dict[str, Any]) -> dict[str, Any]:
        schema = params.get("json_schema")
        grammar = grammars.get(schema) if schema else None
        penalty = params.get("repetition_penalty", 1.0)
        ids: list[int] = []
        for tok in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=penalty, grammar=grammar):
            ids.append(tok)
            eog = llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok)
            if len(ids) == params["max_new_tokens"] or (eog and not params["ignore_eos"]):
                break
        return {"ids": ids}

    def call(prompts: list[list[int]], params: dict[str, Any]) -> list[dict[str, Any]]:
        schema = params.get("json_schema")
        if schema and schema not in grammars:
            grammars[schema] = llama_cpp.LlamaGrammar.from_json_schema(schema, verbose=False)
        return [one(p, params) for p in prompts]

    runs = time_runs(spec, call, reset=llm.reset)
    extra = "" if spec["engine_args"].get("extra_bufts", True) else bw.NO_EXTRA
    return {"version": llama_cpp.__version__ + extra, **load, "runs": runs}


def time_runs(spec: dict[str, Any], call, reset) -> list[dict[str, Any]]:
    """The warm-ups, then each run: batch 1 as one call per prompt, else one call for all;
    only the calls are timed."""
    for prompt, params in spec["warmups"]:
        call([prompt], params)
    results = []
    for run in spec["runs"]:
        reset()
        groups = [[p] for p in run["prompts"]] if run["batch"] == 1 else [run["prompts"]]
        seconds, outs = 0.0, []
        for prompts in groups:
            start = time.perf_counter()
            outs += call(prompts, run["params"])
            seconds += time.perf_counter() - start
        results.append({"seconds": seconds, "outputs": outs})
    return results


# -- the driver -----------------------------------------------------------------------------------
def worker_spec(gguf: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What every worker gets: the runs, the warm-ups, llama.cpp's context size."""
    longest = max(len(p) + r["params"]["max_new_tokens"] for r in runs for p in r["prompts"])
    warm = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    repeats = [100 + (7 * i) % 997 for i in range(16)] * 4  # something for speculation to match
    # The longest prompt too: llama.cpp with a draft model keeps every row's logits, and the
    # first prompt that fills its buffers costs it seconds more than later ones.
    warmups = [(repeats, warm), (max((p for r in runs for p in r["prompts"]), key=len), warm)]
    schemas = sorted({r["params"]["json_schema"] for r in runs if "json_schema" in r["params"]})
    warmups += [(repeats, {**warm, "ignore_eos": False, "json_schema": s}) for s in schemas]
    return {
        "gguf": gguf,
        "threads": THREADS,
        "n_ctx": -(-(longest + 64) // 256) * 256,
        "warmups": warmups,
        "runs": runs,
    }


def job_args(job: str, args: argparse.Namespace) -> dict[str, Any]:
    if job == "radixrt-base":
        return bcpu.parse_engine_args(args.radixrt_args)
    if job == "radixrt-spec":
        return bcpu.parse_engine_args(f"{args.radixrt_args} {args.spec_args}")
    return {"lookup": [args.lookup_ngram, args.lookup_tokens]} if job == "llamacpp-lookup" else {}


def run_job(job: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    venv = Path(args.venvs).expanduser() / "llamacpp" / "bin" / "python"
    python, engine = (sys.executable, "radixrt") if job.startswith("radixrt") else (venv, "llama")
    result = run_worker(str(python), engine, {**spec, "engine_args": job_args(job, args)}, args)
    if engine == "llama" and result.get("crashed"):  # as bench_cpu.py: AMX repacking crashes
        print("llama.cpp crashed; again without its extra weight buffers", file=sys.stderr)
        plain = {**spec, "engine_args": {**job_args(job, args), "extra_bufts": False}}
        result = run_worker(str(python), engine, plain, args)
    return result


def run_worker(python: str, engine: str, spec: dict[str, Any], args) -> dict[str, Any]:
    cmd = [python, __file__, "--worker", engine]
    return bcpu.run_json_worker(cmd, spec, args.timeout)


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One job's rounds as one result: the first round's outputs, each run's seconds the median
    (every round's in seconds_each); the first failure if any."""
    failed = [r for r in rounds if "error" in r]
    if failed or len(rounds) == 1:
        return (failed or rounds)[0]
    merged = {**rounds[0], "runs": []}
    for i, run in enumerate(rounds[0]["runs"]):
        each = [r["runs"][i]["seconds"] for r in rounds]
        merged["runs"].append({**run, "seconds": statistics.median(each), "seconds_each": each})
    return merged


# -- the report -----------------------------------------------------------------------------------
def fmt(x: float | None, spec: str = "{:,.1f}") -> str:
    return "—" if x is None else spec.format(x)


def verdict(r: dict[str, Any]) -> str:
    parts = []
    if r["target"] is not None and r["spec_speedup"] is not None:
        mark = "met" if r["spec_speedup"] >= r["target"] else "MISSED"
        parts.append(f"≥{r['target']:.2f}× {mark}")
    if r["vs_llamacpp_lookup"] is not None:
        parts.append("ahead of lookup" if r["vs_llamacpp_lookup"] > 1 else "BEHIND lookup")
    return ", ".join(parts) or "—"


def speed(job: str):
    return lambda r: fmt(r["tok_s"][job]) if r["tok_s"][job] else r["errors"].get(job, "—")


# The table's columns: (title, the cell of a row).
COLUMNS = [
    ("workload", lambda r: r["workload"]),
    ("batch", lambda r: str(r["batch"])),
    ("requests", lambda r: str(r["requests"])),
    ("context match", lambda r: fmt(r["context_match"], "{:.0%}")),
    ("radixrt tok/s", speed("radixrt-base")),
    ("radixrt spec tok/s", speed("radixrt-spec")),
    ("spec ÷ base", lambda r: fmt(r["spec_speedup"], "{:.2f}×")),
    ("accept length", lambda r: fmt(r["accept_length"], "{:.2f}")),
    ("spec ≠ base", lambda r: fmt(r["spec_differs"], "{}")),
    ("llama.cpp tok/s", speed("llamacpp-base")),
    ("llama.cpp lookup tok/s", speed("llamacpp-lookup")),
    ("radixrt spec ÷ llama.cpp lookup", lambda r: fmt(r["vs_llamacpp_lookup"], "{:.2f}×")),
    ("targets", verdict),
]


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(t for t, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r) for _, cell in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def header(args: argparse.Namespace, gguf: str, results: dict[str, dict[str, Any]]) -> list:
    flags = subprocess.run(
        "grep -o -w -E 'avx2|avx512f|avx512_bf16|avx512_vnni|amx_tile' /proc/cpuinfo | sort -u",
        shell=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    git = ["git", "-C", str(Path(__file__).parent)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"CPU: {bcpu.cpu_model()} ({os.cpu_count()} logical CPUs; {' '.join(flags)}), "
        f"{THREADS} threads per engine" + (" — QUICK (smoke run)" if args.quick else ""),
        f"commit {commit.stdout.strip()}{' (uncommitted changes)' if dirty else ''}, "
        f"{datetime.datetime.now().isoformat(timespec='minutes')}, {Path(gguf).name}",
        "command: " + shlex.join([Path(sys.executable).name, *sys.argv]),
        f"radixrt spec: {args.spec_args or '(none: speculation off)'}; llama.cpp lookup: "
        f"LlamaPromptLookupDecoding(max_ngram_size={args.lookup_ngram}, "
        f"num_pred_tokens={args.lookup_tokens}); llama.cpp's batch 16 runs its requests in turn",
    ]
    lines += [f"- {k}: {r['version']}" for k, r in results.items() if "version" in r]
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engines", default="radixrt,llamacpp", help=f"{list(GROUPS)} or {JOBS}")
    p.add_argument("--workloads", default="code_rewrite,extraction,quote,multi_turn,random")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--requests", type=int, default=4, help="requests of each batch-1 run")
    p.add_argument("--max-new-tokens", dest="max_new", type=int, default=256)
    p.add_argument("--quick", action="store_true", help="16 new tokens, <= 2 requests per run")
    p.add_argument("--dry", action="store_true", help="print the workloads, run nothing")
    p.add_argument("--model-path", "--gguf", help="a GGUF file (default: radixrt's default)")
    p.add_argument("--spec-args", default=SPEC_ARGS, help="Engine flags turning speculation on")
    p.add_argument("--radixrt-args", default="", help="Engine flags for both radixrt runs")
    p.add_argument("--lookup-tokens", type=int, default=10, help="llama.cpp's num_pred_tokens")
    p.add_argument("--lookup-ngram", type=int, default=2, help="llama.cpp's max_ngram_size")
    p.add_argument("--venvs", default=bcpu.DEFAULT_VENVS)
    p.add_argument("--rounds", type=int, default=1, help="runs per engine, order alternating")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per engine")
    p.add_argument("--out", help="write every figure as JSON")
    args = p.parse_args(argv)
    args.jobs = [j for name in args.engines.split(",") for j in GROUPS.get(name, (name,))]
    bad = sorted(set(args.jobs) - set(JOBS)) + sorted(
        set(args.workloads.split(",")) - set(wl.TASKS)
    )
    if bad:
        p.error(f"unknown {bad}; engines: {list(GROUPS)} {JOBS}, workloads: {list(wl.TASKS)}")
    args.batch_sizes = [int(b) for b in args.batches.split(",")]
    args.max_new = 16 if args.quick else args.max_new
    args.requests = 1 if args.quick else args.requests
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    gguf = args.model_path or bcpu.default_gguf()
    from radixrt.loader.tokenizer import load_tokenizer

    sizes = (args.requests, args.batch_sizes, 2 if args.quick else None)
    runs = wl.build_runs(load_tokenizer(gguf), args.workloads.split(","), *sizes, args.max_new)
    spec = worker_spec(gguf, runs)
    if args.dry:
        print("\n".join(wl.describe(r) for r in runs) + f"\nllama.cpp's n_ctx {spec['n_ctx']}")
        print("\n".join(f"{job}: {job_args(job, args)}" for job in args.jobs))
        return {}
    rounds: dict[str, list[dict[str, Any]]] = {job: [] for job in args.jobs}
    for order in bcpu.round_orders(args.jobs, args.rounds):
        for job in order:  # one engine at a time
            print(f"running {job}", file=sys.stderr)
            rounds[job].append(run_job(job, spec, args))
    results = {job: merge_rounds(rs) for job, rs in rounds.items()}
    full = {job: results.get(job, {"error": "not run"}) for job in JOBS}
    rows = [wl.row(i, run, full, JOBS) for i, run in enumerate(runs)]
    head = header(args, gguf, results)
    print("\n".join(head) + "\n\n" + table(rows))
    if args.out:
        for r in results.values():  # the JSON keeps each output's length, not its token ids
            for run in r.get("runs", []):
                for o in run["outputs"]:
                    o["tokens"] = len(o.pop("ids"))
        report = {"header": head, "rows": rows, "results": results}
        Path(args.out).write_text(json.dumps(report, indent=2))
    return {"rows": rows, "results": results}


def worker_main(argv: list[str]) -> None:
    engine, spec_path, out_path = argv
    spec = json.loads(Path(spec_path).read_text())
    worker = {"radixrt": radixrt_worker, "llama": llamacpp_worker}[engine]
    Path(out_path).write_text(json.dumps(worker(spec)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_main(sys.argv[2:])
    else:
        main()
