"""llama.cpp's side of the GGUF checks: run with the llamacpp venv's python (made by
scripts/bench_cpu_setup.sh), never the project's, which has no llama_cpp.

    LLAMACPP_PYTHON scripts/llamacpp_reference.py < requests.json > responses.json

stdin is a JSON list of requests, stdout the JSON list of their responses in the same order;
one process serves them all, so llama_cpp is imported once. Requests, by "op":

- quantize {src, dst, ftype, threads}: llama.cpp's own quantizer, `llama_model_quantize`
  with its default parameters and LLAMA_FTYPE_MOSTLY_<ftype> (e.g. "Q4_K_M") -> {}.
- tokenize {model, texts, add_special=true}: the file's tokenizer (vocab only) -> {tokens}.
- greedy {model, prompts, new_tokens, threads}: per prompt, llama.cpp's greedy continuation
  over its raw logits (no sampler: no penalties, EOS is just another token) and, at each step,
  the gap between its two largest logits -> {runs: [{tokens, margins}]}.

A failed request raises: the process exits non-zero with the traceback on stderr.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

import llama_cpp
import numpy as np

# llama.cpp's KV cache type: F32 (GGML_TYPE_F32), not its default F16, so the reference's
# attention rounds no more than radixrt's float32 pool; what is left to differ is the weights'
# arithmetic (llama.cpp multiplies quantized weights by q8-rounded activations).
KV_TYPE_F32 = 0


def quantize(req: dict[str, Any]) -> dict[str, Any]:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{req['ftype']}")
    params.nthread = req.get("threads", 2)
    rc = llama_cpp.llama_model_quantize(
        req["src"].encode(), req["dst"].encode(), ctypes.byref(params)
    )
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({req['ftype']}) returned {rc}")
    return {}


def tokenize(req: dict[str, Any]) -> dict[str, Any]:
    llm = llama_cpp.Llama(model_path=req["model"], vocab_only=True, verbose=False)
    add = req.get("add_special", True)
    return {"tokens": [llm.tokenize(t.encode(), add_bos=add) for t in req["texts"]]}


def greedy(req: dict[str, Any]) -> dict[str, Any]:
    threads, new = req.get("threads", 2), req["new_tokens"]
    longest = max(len(p) for p in req["prompts"])
    llm = llama_cpp.Llama(
        model_path=req["model"],
        n_ctx=max(256, longest + new + 8),
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        type_k=KV_TYPE_F32,
        type_v=KV_TYPE_F32,
        seed=0,
        verbose=False,
    )
    return {"runs": [_continue(llm, prompt, new) for prompt in req["prompts"]]}


def _continue(llm: Any, prompt: list[int], new: int) -> dict[str, list]:
    llm.reset()  # eval() then drops the previous sequence's KV entries
    llm.eval(prompt)
    tokens, margins = [], []
    for step in range(new):
        # The last evaluated position's logits, read from the context: without logits_all,
        # Llama.eval() keeps none of them.
        row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()
        second, first = np.argpartition(logits, -2)[-2:]
        if logits[second] > logits[first]:
            first, second = second, first
        tokens.append(int(first))
        margins.append(float(logits[first] - logits[second]))
        if step + 1 < new:
            llm.eval([int(first)])
    return {"tokens": tokens, "margins": margins}


OPS = {"quantize": quantize, "tokenize": tokenize, "greedy": greedy}


def main() -> None:
    requests = json.load(sys.stdin)
    # llama.cpp's C code may print to fd 1: the responses get a copy of it, and fd 1 becomes
    # stderr, so nothing else lands in the JSON.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    json.dump([OPS[r["op"]](r) for r in requests], out)
    out.close()


if __name__ == "__main__":
    main()
