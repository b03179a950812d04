"""Run SGLang's own frontend test programs (`sglang/test/test_programs.py` of the sglang wheel)
against a running radixrt server and sort each outcome: passed, the model's answer (an
AssertionError on what the model said), or an API failure (anything else).

Two ways, as the SGLang-compatibility issue asks:
  --client sglang   SGLang's unmodified client: run with a Python that imports the real
                    `sglang` package (e.g. the venv tests/lang/test_sglang_client.py builds).
  --client radixrt  radixrt's DSL: the file is loaded with `import sglang as sgl` and
                    `sglang.lang.ir` rewritten to radixrt's names, nothing else changed.

    python scripts/sglang_programs.py --url http://127.0.0.1:30000 --client radixrt \
        --programs /path/to/sglang/test/test_programs.py
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import traceback
import types
from pathlib import Path

PROGRAMS = [
    "test_few_shot_qa",
    "test_mt_bench",
    "test_select",
    "test_decode_int",
    "test_decode_json_regex",
    "test_decode_json",
    "test_expert_answer",
    "test_tool_use",
    "test_react",
    "test_parallel_decoding",
    "test_parallel_encoding",
    "test_stream",
    "test_stream_logprobs",
    "test_regex",
    "test_dtype_gen",
    "test_gen_min_new_tokens",
    "test_completion_speculative",
    "test_chat_completion_speculative",
]
ARGS = {"test_select": {"check_answer": False}}


def load_programs(path: Path, client: str) -> types.ModuleType:
    # SGLang's server-side helpers (is_hip, get_tokenizer) pull in torchvision and CUDA
    # checks; the programs only need a tokenizer for the model path the server reports.
    source = (
        path.read_text()
        .replace("from sglang.srt.utils import is_hip", "is_hip = lambda: False")
        .replace(
            "from sglang.srt.utils.hf_transformers_utils import get_tokenizer",
            "get_tokenizer = _harness_get_tokenizer",
        )
    )
    if client == "radixrt":
        source = source.replace("import sglang as sgl", "import radixrt as sgl").replace(
            "from sglang.lang.ir import", "from radixrt.lang.ir import"
        )
    module = types.ModuleType("sglang_test_programs")
    module.__dict__["_harness_get_tokenizer"] = _get_tokenizer
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def _get_tokenizer(model_path: str):
    """transformers' tokenizer of a model folder or a .gguf file (what /model_info reports)."""
    from transformers import AutoTokenizer

    if model_path.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(
            os.path.dirname(model_path), gguf_file=os.path.basename(model_path)
        )
    return AutoTokenizer.from_pretrained(model_path)


def run_one(module: types.ModuleType, name: str, timeout_s: float) -> dict:
    """Run one program on a thread; one that has not ended after timeout_s is a hang."""
    result: dict = {
        "name": name,
        "outcome": "API failure",
        "detail": f"no end after {timeout_s:.0f} s (a hang)",
    }
    thread = threading.Thread(target=lambda: result.update(_outcome(module, name)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    return result


def _outcome(module: types.ModuleType, name: str) -> dict:
    try:
        getattr(module, name)(**ARGS.get(name, {}))
        return {"name": name, "outcome": "passed", "detail": ""}
    except AssertionError as exc:
        return {"name": name, "outcome": "model answer", "detail": str(exc)[:300]}
    except Exception as exc:  # noqa: BLE001 - the point is to sort them
        return {
            "name": name,
            "outcome": "API failure",
            "detail": "".join(traceback.format_exception_only(exc)).strip()[:500],
            "where": traceback.format_exc()[-1500:],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--client", choices=["sglang", "radixrt"], required=True)
    parser.add_argument(
        "--programs",
        type=Path,
        help="test_programs.py (default: the one of the importable sglang package)",
    )
    parser.add_argument("--only", nargs="*", default=PROGRAMS)
    parser.add_argument("--timeout-s", type=float, default=300, help="per program")
    args = parser.parse_args()
    path = args.programs
    if path is None:
        import sglang.test

        path = Path(sglang.test.__file__).with_name("test_programs.py")
    if args.client == "sglang":
        import sglang as sgl
    else:
        import radixrt as sgl
    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    module = load_programs(path, args.client)
    results = []
    for name in args.only:
        results.append(run_one(module, name, args.timeout_s))
        r = results[-1]
        print(f"{r['outcome']:>12}  {r['name']}  {r['detail'][:160]}", flush=True)
    print("JSON " + json.dumps(results), flush=True)
    # A hung program's thread cannot be joined: leave without waiting for it.
    os._exit(1 if any(r["outcome"] == "API failure" for r in results) else 0)


if __name__ == "__main__":
    main()
