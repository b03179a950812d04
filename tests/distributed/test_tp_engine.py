"""Tensor parallelism end to end on the CPU (gloo, fp32, tiny random models): --tp-size 2
says exactly what one rank says, the ranks' lockstep check passes (and catches a rank that
diverges), and a killed rank ends a launched server naming it within seconds."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import pytest
import torch
import torch.multiprocessing as mp
from launch_helpers import LaunchedServer, launch

import radixrt

PAGE = 16
# 12 pages for 6 requests of 56 prompt tokens (a 48-token shared prefix) and up to 24 new
# tokens each: the decodes outgrow the pool, so requests are preempted and recomputed.
ENGINE_ARGS = dict(
    page_size=PAGE,
    max_total_tokens=12 * PAGE,
    schedule_conservativeness=0.0,  # admit without a reserve for the decodes' growth
    num_threads=1,  # two ranks share the CPU
    chunked_prefill_size=32,
    max_prefill_tokens=64,
    dtype="float32",
    device="cpu",
    enable_kv_checks=True,
    dist_timeout=20,
)
SHARED = [(7 * i + 3) % 250 + 3 for i in range(48)]
PROMPTS = [SHARED + [(11 * i + j) % 250 + 3 for j in range(8)] for i in range(6)]
PARAMS = [{"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}] * 5 + [
    {"temperature": 0, "max_new_tokens": 12, "regex": "[a-c]{3}-(yes|no)!"}
]


def _run_engine(model_path: str, tp_size: int, **extra) -> tuple[list[list[int]], dict]:
    engine = radixrt.Engine(
        model_path, in_process=tp_size == 1, tp_size=tp_size, **ENGINE_ARGS, **extra
    )
    try:
        first = engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)
        again = engine.generate(input_ids=PROMPTS[:2], sampling_params=PARAMS[:2])  # cache hits
        stats = engine.get_stats(check_kv=True)
    finally:
        engine.shutdown()
    return [o["output_ids"] for o in first + again], stats


# Phi-3's LongRoPE switch at 60: the prompts (56) start short and every request is computed
# again, long, as it grows past 60 (with 64 the pool happened to never run short).
OVERRIDES = {"phi3": dict(original_max_position_embeddings=60)}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "qwen3_moe", "smollm3", "phi3"])
def test_tp2_greedy_equals_tp1(tiny_model_dir, arch):
    path = tiny_model_dir(arch, **OVERRIDES.get(arch, {}))
    want, stats1 = _run_engine(path, 1)
    got, stats2 = _run_engine(path, 2)
    assert got == want
    assert re.fullmatch(r"[a-c]{3}-(yes|no)!", _text_of(path, got[5]))  # the grammar held
    for stats in (stats1, stats2):  # (how many depends on when the requests arrived)
        assert stats["num_preemptions"] > 0  # the pool is small enough to preempt
        assert stats["cached_tokens"] > 0


def test_tp2_speculating_equals_tp1_without(tiny_model_dir):
    """Rank 0 drafts and decides; the other rank follows its drafts (and their rejection)."""
    path = tiny_model_dir("llama")
    want, _ = _run_engine(path, 1)
    got, stats = _run_engine(path, 2, speculative_algorithm="NGRAM")
    assert got == want
    assert stats["spec_draft_tokens"] > 0 and stats["num_preemptions"] > 0


def _text_of(path: str, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path).decode(ids, skip_special_tokens=True)


# -- the lockstep check, with two real gloo ranks and stand-in schedulers ------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stand_in_scheduler(output_ids: list[int]) -> SimpleNamespace:
    """What state_digest reads of a scheduler: one running request, an empty tree."""
    from radixrt.cache.allocator import PageAllocator
    from radixrt.cache.base import create_prefix_cache
    from radixrt.cache.req_to_token import ReqToTokenTable
    from radixrt.protocol.sampling_params import SamplingParams
    from radixrt.scheduler.req import Req

    allocator = PageAllocator(8, 1)
    table = ReqToTokenTable(2, 16, "cpu")
    req = Req("r", [1, 2, 3], SamplingParams(), output_ids=output_ids)
    req.table_row, req.num_slots = table.alloc_row(), 3
    table.write(req.table_row, 0, torch.tensor([4, 5, 6]))
    parts = SimpleNamespace(
        table=table, cache=create_prefix_cache("radix", allocator), allocator=allocator
    )
    return SimpleNamespace(running=[req], waiting=[], parts=parts, stats=SimpleNamespace(steps=3))


def _check_rank(rank: int, port: int, out: dict) -> None:
    from radixrt.distributed import init_tp_group
    from radixrt.errors import LockstepError
    from radixrt.scheduler.lockstep import Follower, Leader

    group = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", "cpu", timeout_s=20)
    lockstep = (Leader if rank == 0 else Follower)(group, check=True, local_ranks=range(2))
    for diverge in (False, True):  # then rank 1 has taken one token rank 0 did not
        scheduler = _stand_in_scheduler([9, 9] + ([8] if diverge and rank == 1 else []))
        try:
            lockstep.check_agreement(scheduler)  # type: ignore[arg-type]
            out[(rank, diverge)] = "agreed"
        except LockstepError as e:
            out[(rank, diverge)] = str(e)


def test_lockstep_check_names_a_diverged_rank():
    port = _free_port()
    with mp.Manager() as manager:
        out = manager.dict()
        procs = [
            mp.get_context("spawn").Process(target=_check_rank, args=(r, port, out))
            for r in range(2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        result = dict(out)
    assert result[(0, False)] == result[(1, False)] == "agreed"
    for rank in (0, 1):  # every rank stops, naming the one that differs
        assert "rank(s) 1 diverged from rank 0 after step 3" in result[(rank, True)]


# -- a dead rank -------------------------------------------------------------------------


def _server_with_two_ranks(path: str, tmp_path) -> tuple[LaunchedServer, int]:
    """A launched --tp-size 2 server that has answered once, and rank 1's pid."""
    flags = ["--model-path", path, "--tp-size", "2", "--device", "cpu", "--dtype", "float32"]
    flags += ["--max-total-tokens", "512", "--dist-timeout", "3", "--skip-tokenizer-init"]
    server = launch(tmp_path, *flags)
    assert httpx.post(server.url + "/generate", json=BODY, timeout=60).status_code == 200
    found = re.search(r"scheduler rank 1 ready in .* \(pid (\d+)\)", server.log_text())
    assert found, server.log_text()
    return server, int(found.group(1))


BODY = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}


def test_killed_rank_ends_the_server_naming_it(tiny_model_dir, tmp_path):
    server, rank1 = _server_with_two_ranks(tiny_model_dir("llama"), tmp_path)
    try:
        start = time.monotonic()
        os.kill(rank1, signal.SIGKILL)
        code = server.proc.wait(timeout=30)
        took = time.monotonic() - start
    finally:
        server.stop()
    log = server.log_text()
    assert code == 1, log
    assert took < 15, log
    assert f"scheduler rank 1 (pid {rank1}) was killed by signal 9" in log


def test_stuck_rank_ends_the_server_within_the_timeout(tiny_model_dir, tmp_path):
    """A rank that stops answering (SIGSTOP: its process lives) is a RankDied on rank 0 after
    --dist-timeout (3 s): the request gets a 503 saying so and the server exits 1."""
    server, rank1 = _server_with_two_ranks(tiny_model_dir("llama"), tmp_path)
    try:
        os.kill(rank1, signal.SIGSTOP)
        start = time.monotonic()
        reply = httpx.post(server.url + "/generate", json=BODY, timeout=60)
        code = server.proc.wait(timeout=30)
        took = time.monotonic() - start
    finally:
        server.stop()
        with contextlib.suppress(ProcessLookupError):  # the server kills it on its way out
            os.kill(rank1, signal.SIGKILL)
    assert reply.status_code == 503
    assert "RankDied" in reply.json()["error"]["message"]
    assert "did not answer within 3 s" in reply.json()["error"]["message"]
    assert code == 1, server.log_text()
    assert took < 15, server.log_text()


def test_two_nodes_of_one_rank_each(tiny_model_dir, tmp_path):
    """--nnodes 2 on one machine: node 1's `launch` runs only rank 1 (no HTTP server); node 0
    serves; both end cleanly when node 0 stops."""
    path = tiny_model_dir("llama")
    flags = ["--model-path", path, "--tp-size", "2", "--nnodes", "2", "--device", "cpu"]
    flags += ["--dtype", "float32", "--max-total-tokens", "512", "--skip-tokenizer-init"]
    flags += ["--dist-init-addr", f"127.0.0.1:{_free_port()}", "--num-threads", "1"]
    node1_log = tmp_path / "node1.log"
    with open(node1_log, "w") as log:
        node1 = subprocess.Popen(
            [sys.executable, "-m", "radixrt.cli", "launch", *flags, "--node-rank", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        server = launch(tmp_path, *flags, "--node-rank", "0")
        body = {"input_ids": PROMPTS[0], "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        got = httpx.post(server.url + "/generate", json=body, timeout=60).json()["output_ids"]
        server.stop()
        assert server.proc.returncode == 0, server.log_text()
        assert node1.wait(timeout=30) == 0, node1_log.read_text()
    finally:
        node1.kill()
        node1.wait()
    engine = radixrt.Engine(path, in_process=True, skip_tokenizer_init=True, dtype="float32")
    try:
        want = engine.generate(input_ids=PROMPTS[0], sampling_params=body["sampling_params"])
    finally:
        engine.shutdown()
    assert got == want["output_ids"]
    assert "node 1 of 2: tensor-parallel ranks 1..1" in node1_log.read_text()
