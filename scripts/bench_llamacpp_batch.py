"""llama.cpp's batched arm of scripts/bench_cpu.py (bench_cpu_workers.llamacpp_worker): a
workload's prompts as the sequences of one context, as llama.cpp's `batched` and `parallel`
examples and its server run them. Imports only the standard library; the worker passes in
llama-cpp-python's module.
"""

from __future__ import annotations

from typing import Any


class LlamaBatcher:
    """Runs one workload's prompts as sequences 0..n-1 of one llama.cpp context, made for it
    (untimed) by `prepare`."""

    def __init__(self, llama_cpp: Any, model: Any, threads: int) -> None:
        self.lib, self.model, self.threads = llama_cpp, model, threads
        self.ctx = self.batch = None
        self.shared, self.n_batch = 0, 0  # the prepared workload's shared prefix, batch size
        self.sampler = llama_cpp.llama_sampler_init_greedy()

    def prepare(self, prompts: list[list[int]], new: int) -> None:
        lib = self.lib
        if self.ctx is not None:
            lib.llama_batch_free(self.batch)
            lib.llama_free(self.ctx)
        params = lib.llama_context_default_params()
        params.n_seq_max = len(prompts)
        params.n_threads = params.n_threads_batch = self.threads
        self.shared = common_prefix_all(prompts) if len(prompts) > 1 else 0
        params.kv_unified = self.shared > 0
        params.n_ctx = context_cells(prompts, new)
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context")
        self.n_batch = params.n_batch
        self.batch = lib.llama_batch_init(max(params.n_batch, len(prompts)), 0, 1)

    def run(self, prompts: list[list[int]], new: int) -> tuple[list[int], int | None]:
        lib, n, shared = self.lib, len(prompts), self.shared
        if shared:  # the shared prefix once, on sequence 0, then copied to the others
            self.decode([(t, i, 0, False) for i, t in enumerate(prompts[0][:shared])])
            memory = lib.llama_get_memory(self.ctx)
            for s in range(1, n):
                lib.llama_memory_seq_cp(memory, 0, s, -1, -1)
        rest = [
            (t, i, s, i == len(p) - 1)
            for s, p in enumerate(prompts)
            for i, t in enumerate(p[shared:], start=shared)
        ]
        last = self.decode(rest)  # the first new token of each sequence
        made, lengths = [[last[s]] for s in range(n)], [len(p) for p in prompts]
        for _ in range(new - 1):
            step = self.decode(
                [(made[s][-1], lengths[s] + len(made[s]) - 1, s, True) for s in range(n)]
            )
            for s in range(n):
                made[s].append(step[s])
        return [len(m) for m in made], shared * (n - 1)

    def decode(self, tokens: list[tuple[int, int, int, bool]]) -> dict[int, int]:
        """Decode (token, position, sequence, sample?) in batches of n_batch; the greedy
        token after each sampled one, by sequence."""
        lib, batch, sampled = self.lib, self.batch, {}
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            for i, (token, pos, seq, logits) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, logits
            batch.n_tokens = len(chunk)
            if lib.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            for i, (_, _, seq, logits) in enumerate(chunk):
                if logits:
                    sampled[seq] = lib.llama_sampler_sample(self.sampler, self.ctx, i)
        return sampled


def round_up(n: int, to: int = 256) -> int:
    return (n + to - 1) // to * to


def context_cells(prompts: list[list[int]], new: int) -> int:
    """The context made for a workload: one unified buffer where the prompts share a prefix,
    else a stream of the longest sequence's cells for each."""
    if len(prompts) > 1 and common_prefix_all(prompts) > 0:
        return cells(prompts, new)
    return len(prompts) * round_up(max(len(p) for p in prompts) + new)


def cells(prompts: list[list[int]], new: int) -> int:
    """The KV cells a workload fills in one unified buffer: its shared prefix once, then each
    sequence's own tokens."""
    shared = common_prefix_all(prompts) if len(prompts) > 1 else 0
    return round_up(shared + sum(len(p) - shared + new for p in prompts))


def common_prefix_all(prompts: list[list[int]]) -> int:
    """The longest prefix every prompt shares, leaving each at least its last token."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    return next((i for i in range(n) if any(p[i] != first[i] for p in prompts)), max(n, 0))
