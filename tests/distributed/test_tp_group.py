"""radixrt.distributed's communicator on gloo, with two real ranks (processes)."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from radixrt.distributed import RankDied, TPGroup, init_tp_group


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collectives(rank: int, port: int, out: dict) -> None:
    group = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", "cpu", timeout_s=20)
    t = torch.full((3,), float(rank + 1))
    summed = group.all_reduce(t.clone()).tolist()
    gathered = group.all_gather(torch.tensor([[rank, rank]]), dim=1).tolist()
    payload = group.broadcast_bytes(b"\x00relay\xff" * 1000 if rank == 0 else None)
    empty = group.broadcast_bytes(b"" if rank == 0 else None)
    ids = group.broadcast(torch.tensor([7, 8]) if rank == 0 else torch.zeros(2, dtype=torch.long))
    group.barrier()
    out[rank] = (summed, gathered, payload, empty, ids.tolist())


def _one_rank_leaves(rank: int, port: int, out: dict) -> None:
    group = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", "cpu", timeout_s=3)
    group.barrier()
    if rank == 1:
        os._exit(0)  # dies without a word, as a killed rank would
    start = time.monotonic()
    try:
        group.all_reduce(torch.ones(1))
        out[rank] = ("no error", 0.0)
    except RankDied as e:
        out[rank] = (str(e), time.monotonic() - start)


def _run(target, port: int) -> dict:
    with mp.Manager() as manager:
        out = manager.dict()
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=target, args=(r, port, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert not p.is_alive(), "a rank hung"
        return dict(out)


def test_collectives_on_two_gloo_ranks():
    out = _run(_collectives, _free_port())
    for rank in (0, 1):
        summed, gathered, payload, empty, ids = out[rank]
        assert summed == [3.0, 3.0, 3.0]
        assert gathered == [[0, 0, 1, 1]]
        assert payload == b"\x00relay\xff" * 1000
        assert empty == b""
        assert ids == [7, 8]


def test_a_dead_rank_is_an_error_naming_the_collective_not_a_hang():
    out = _run(_one_rank_leaves, _free_port())
    message, waited = out[0]
    assert "all_reduce" in message and "rank 0 of 2" in message, message
    assert waited < 15


def test_the_group_of_one_returns_its_input():
    group = TPGroup.single()
    t = torch.arange(4.0)
    assert group.all_reduce(t) is t and group.all_gather(t) is t
    assert group.broadcast_bytes(b"x") == b"x" and group.is_leader
    with pytest.raises(AssertionError):
        group.broadcast_bytes(None)
