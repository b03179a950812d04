"""The per-engine halves of scripts/bench_cpu.py: each runs in that engine's own virtual
environment, one process per engine, so this module imports only the standard library at its
top; an engine's packages are imported inside its worker.

    PYTHON scripts/bench_cpu_workers.py ENGINE SPEC.json RESULT.json
    PYTHON scripts/bench_cpu_workers.py convert MODEL.gguf HF_DIR

SPEC.json (written by bench_cpu.py): gguf, hf_dir, threads, max_len, engine_args, warmup
(token ids) and workloads (name, prompts, new_tokens). RESULT.json: engine, version, dtype,
ready_s (seconds from just before the engine's constructor to it returning, ready for a
request), rss_load_mib and rss_end_mib (the summed VmRSS of this process and every descendant,
right after that and after the last workload), pss_load_mib and pss_end_mib (their PSS)
and, per workload, seconds, prompt_tokens, output_tokens and cached_tokens (None where the
engine does not say). Model load and the warm-up request are not in a workload's seconds. A
worker that cannot do what was asked raises; the driver reports its error instead of a figure.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bench_llamacpp_batch import LlamaBatcher

# One workload, run to completion: (prompts, new tokens each) -> (tokens generated per prompt,
# prompt tokens served from the engine's cache or None where it does not say).
RunFn = Callable[[list[list[int]], int], tuple[list[int], int | None]]


def ready(start: float) -> dict[str, float]:
    """The load figures, taken the moment the engine's constructor has returned: seconds since
    `start` (perf_counter just before the call) and the resident memory of its processes."""
    seconds = time.perf_counter() - start
    return {"ready_s": seconds, "rss_load_mib": tree_rss_mib(), "pss_load_mib": tree_pss_mib()}


def tree_rss_mib(pid: int | None = None) -> float:
    """VmRSS summed over a process and all its descendants (an engine's scheduler and
    detokenizer processes), MiB. Pages shared between them count in each."""
    return _tree_kib(pid, _vmrss_kib) / 1024


def tree_pss_mib(pid: int | None = None) -> float:
    """PSS summed over the same tree, MiB: a page shared by k processes counts 1/k in each,
    so the sum is the memory the tree holds (the torch library the processes share, once)."""
    return _tree_kib(pid, _pss_kib) / 1024


def _tree_kib(pid: int | None, kib: Callable[[int], int]) -> int:
    todo, total_kib = [pid or os.getpid()], 0
    parents = None
    while todo:
        p = todo.pop()
        total_kib += kib(p)
        kids = _children(p)
        if kids is None:  # no /proc/PID/task/*/children here: parents from every /proc/*/stat
            parents = _parents() if parents is None else parents
            kids = [c for c, parent in parents.items() if parent == p]
        todo += kids
    return total_kib


def _vmrss_kib(pid: int) -> int:
    return _proc_field_kib(f"/proc/{pid}/status", "VmRSS:")  # a zombie has none: 0


def _pss_kib(pid: int) -> int:
    return _proc_field_kib(f"/proc/{pid}/smaps_rollup", "Pss:")


def _proc_field_kib(path: str, field: str) -> int:
    """The kB figure of the line starting with `field` in a /proc file; 0 where there is none
    or the process exited meanwhile."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int] | None:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        if not os.path.exists(f"/proc/{pid}/task/{tasks[0]}/children"):
            return None  # a kernel without CONFIG_PROC_CHILDREN
    except (OSError, IndexError):
        return []
    kids = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return kids


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process, from /proc/*/stat (the name may hold ')')."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    out[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def time_workloads(
    spec: dict[str, Any],
    run: RunFn,
    load: dict[str, float],
    prepare: Callable[[list[list[int]], int], None] | None = None,
) -> dict[str, Any]:
    """The warm-up request, then every workload timed; with the load figures and the resident
    memory after the last workload. `prepare(prompts, new)`, untimed, before each."""
    prepare = prepare or (lambda prompts, new: None)
    prepare([spec["warmup"]], 4)
    run([spec["warmup"]], 4)
    results = {}
    for w in spec["workloads"]:
        prompts, new = w["prompts"], w["new_tokens"]
        prepare(prompts, new)
        start = time.perf_counter()
        lengths, cached = run(prompts, new)
        seconds = time.perf_counter() - start
        short = [n for n in lengths if n != new]
        if len(lengths) != len(prompts) or short:
            raise RuntimeError(f"{w['name']}: asked {new} new tokens, got {short or lengths}")
        results[w["name"]] = {
            "seconds": seconds,
            "prompt_tokens": sum(len(p) for p in prompts),
            "output_tokens": sum(lengths),
            "cached_tokens": cached,
        }
    end = {"rss_end_mib": tree_rss_mib(), "pss_end_mib": tree_pss_mib()}
    return {**load, **end, "workloads": results}


# -- radixrt (the project's own venv) ----------------------------------------------------------
def pool_size(spec: dict[str, Any]) -> dict[str, Any]:
    """The same context as llama.cpp's largest (its KV cells as the pool's tokens), unless
    --radixrt-args sizes the pool itself."""
    if {"max_total_tokens", "cpu_kv_cache_gb"} & set(spec["engine_args"]):
        return {}
    return {"max_total_tokens": spec["context_tokens"]}


def radixrt_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import radixrt

    start = time.perf_counter()
    engine = radixrt.Engine(
        model_path=spec["gguf"],
        device="cpu",
        log_level="warning",
        num_threads=spec["threads"],
        **{**pool_size(spec), **spec["engine_args"]},
    )
    load = ready(start)  # Engine() returns once its scheduler process is ready

    def run(prompts: list[list[int]], new: int) -> tuple[list[int], int | None]:
        params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        metas = [o["meta_info"] for o in outs]
        return [m["completion_tokens"] for m in metas], sum(m["cached_tokens"] for m in metas)

    try:
        timed = time_workloads(spec, run, load)
        dtype = engine.get_server_info()["dtype"]
        quant = engine.server_args.quantization
    finally:
        engine.shutdown()
    return {"version": radixrt.__version__, "dtype": f"{dtype}, {quant}", **timed}


# -- vLLM (its CPU build) -----------------------------------------------------------------------
def vllm_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    dtype = spec["engine_args"].get("dtype", "bfloat16")
    start = time.perf_counter()
    llm = LLM(
        model=spec["hf_dir"],
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        max_model_len=spec["max_len"],
        dtype=dtype,
        seed=0,
    )
    load = ready(start)

    def run(prompts: list[list[int]], new: int) -> tuple[list[int], int | None]:
        params = SamplingParams(
            max_tokens=new, min_tokens=new, ignore_eos=True, temperature=0, detokenize=False
        )
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        outs = llm.generate(inputs, params, use_tqdm=False)
        counts = [o.num_cached_tokens for o in outs]
        cached = None if None in counts else sum(counts)
        return [len(o.outputs[0].token_ids) for o in outs], cached

    return {"version": vllm.__version__, "dtype": dtype, **time_workloads(spec, run, load)}


# -- llama.cpp (llama-cpp-python's bindings of its C API) ---------------------------------------
def llamacpp_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp as its batched examples and server run it: a context with a sequence per
    prompt, every prompt's tokens and then every sequence's next token in one llama_decode a
    step, greedy sampling in C (llama_sampler_init_greedy). Unrelated prompts get a KV stream
    each; a prefix all the prompts share is decoded once and given to each sequence with
    llama_memory_seq_cp, in one unified KV buffer (which seq_cp needs)."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    start = time.perf_counter()
    model_params = llama_cpp.llama_model_default_params()
    model_params.use_extra_bufts = spec["engine_args"].get("extra_bufts", True)
    model = llama_cpp.llama_model_load_from_file(spec["gguf"].encode(), model_params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {spec['gguf']}")
    batcher = LlamaBatcher(llama_cpp, model, spec["threads"])
    load = ready(start)
    timed = time_workloads(spec, batcher.run, load, batcher.prepare)
    buf = ctypes.create_string_buffer(256)  # the file's type as llama.cpp names it
    llama_cpp.llama_model_desc(model, buf, len(buf))
    dtype = f"GGUF {buf.value.decode()}"
    dtype += "" if model_params.use_extra_bufts else NO_EXTRA
    return {"version": llama_cpp.__version__, "dtype": dtype, **timed}


NO_EXTRA = " (repacked/AMX weight buffers off: with them it crashed on this CPU)"


def _without_extra_buffers(llama_cpp: Any) -> None:
    # llama.cpp's model parameter `use_extra_bufts` (weights repacked for AVX-512/AMX kernels)
    # for Llama() (scripts/bench_spec.py), which takes no argument for it: its defaults are
    # changed where it reads them.
    low_level = llama_cpp.llama_cpp
    defaults = low_level.llama_model_default_params

    def params() -> Any:
        p = defaults()
        p.use_extra_bufts = False
        return p

    low_level.llama_model_default_params = params


# -- transformers -------------------------------------------------------------------------------
def transformers_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers

    torch.set_num_threads(spec["threads"])
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["hf_dir"], dtype=torch.float32)
    model.eval()
    load = ready(start)

    def run(prompts: list[list[int]], new: int) -> tuple[list[int], int | None]:
        # Prompts within a workload have one length: one batch, no padding.
        ids = torch.tensor(prompts, dtype=torch.long)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=model.config.eos_token_id,
            )
        return [out.shape[1] - ids.shape[1]] * len(prompts), None

    version = f"{transformers.__version__} (torch {torch.__version__})"
    return {"version": version, "dtype": "float32", **time_workloads(spec, run, load)}


# -- the HF folder vLLM and transformers load -------------------------------------------------
def convert(gguf_path: str, out_dir: str) -> None:
    """Dequantize the GGUF into a float32 safetensors folder (config, no tokenizer: every engine
    takes token ids). transformers marks a GGUF-loaded model unsaveable, so the weights and
    config are written by hand, without the GGUF quantization entry."""
    import torch
    import transformers
    from safetensors.torch import save_file

    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    )
    tied = model.config.tie_word_embeddings
    weights = {
        k: v.contiguous()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = "float32"
    os.makedirs(out_dir, exist_ok=True)
    save_file(weights, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    # Last: the driver takes a folder with a config.json as a finished conversion.
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, default=str)


WORKERS = {
    "radixrt": radixrt_worker,
    "vllm": vllm_worker,
    "llamacpp": llamacpp_worker,
    "transformers": transformers_worker,
}


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "convert":
        convert(argv[1], argv[2])
        return
    if len(argv) != 3 or argv[0] not in WORKERS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(WORKERS)}}} SPEC.json RESULT.json")
    with open(argv[1]) as f:
        spec = json.load(f)
    result = WORKERS[argv[0]](spec)
    with open(argv[2], "w") as f:
        json.dump({"engine": argv[0], **result}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
