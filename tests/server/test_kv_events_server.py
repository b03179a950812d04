"""--kv-events-config on a launched server: a SUB socket sees the prompt's pages stored after a
request and everything cleared after /flush_cache; the replay socket serves the batches the
subscriber missed; a bad config stops start-up naming the flag."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import zmq
from launch_helpers import LaunchedServer, free_port, tiny_server_flags
from vllm_kv_events import DECODER, AllBlocksCleared, BlockStored, KVEventBatch

from radixrt.server_args import ServerArgs

PAGE = 4
PROMPT = [(7 * i + 3) % 200 for i in range(4 * PAGE + 2)]  # four whole pages and two tokens


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture(scope="module")
def server(launch_server, tiny_model_dir, ports) -> LaunchedServer:
    pub, replay = ports
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv-events",
    }
    return launch_server(
        *tiny_server_flags(tiny_model_dir("llama")),
        "--page-size",
        str(PAGE),
        "--kv-events-config",
        json.dumps(config),
    )


@pytest.fixture
def sub(server, ports) -> Any:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sock.connect(f"tcp://127.0.0.1:{ports[0]}")
    time.sleep(0.3)  # the subscription must reach the server before it publishes
    yield sock
    sock.close(linger=0)


def events_until(sock: Any, kind: type, timeout_s: float = 20) -> list[tuple[int, Any]]:
    """(seq, event) pairs received until an event of `kind` arrives."""
    got: list[tuple[int, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(200):
            topic, seq, payload = sock.recv_multipart()
            assert topic == b"kv-events"
            batch = DECODER.decode(payload)
            got += [(int.from_bytes(seq, "big"), e) for e in batch.events]
            if any(isinstance(e, kind) for _, e in got):
                return got
    pytest.fail(f"no {kind.__name__} within {timeout_s} s; got {got}")


def post(server: LaunchedServer, path: str, body: dict[str, Any]) -> None:
    httpx.post(server.url + path, json=body, timeout=60).raise_for_status()


def test_a_request_stores_its_pages_and_a_flush_clears_them(server, sub, ports) -> None:
    post(server, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    stored = events_until(sub, BlockStored)
    tokens = [t for _, e in stored if isinstance(e, BlockStored) for t in e.token_ids]
    whole = len(PROMPT) // PAGE * PAGE
    assert tokens[:whole] == PROMPT[:whole], "the prompt's whole pages, in order"
    first = next(e for _, e in stored if isinstance(e, BlockStored))
    assert first.block_size == PAGE and first.parent_block_hash is None
    assert len(first.token_ids) == PAGE * len(first.block_hashes)

    post(server, "/flush_cache", {})
    cleared = events_until(sub, AllBlocksCleared)
    seqs = sorted({seq for seq, _ in stored + cleared})
    assert seqs == list(range(seqs[0], seqs[-1] + 1)), "no gaps in the sequence numbers"

    replayed = replay(ports[1], seqs[0])
    assert [s for s, _ in replayed][: len(seqs)] == seqs
    assert any(isinstance(e, AllBlocksCleared) for _, b in replayed for e in b.events)


def replay(port: int, start: int) -> list[tuple[int, KVEventBatch]]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    sock.send_multipart((b"", start.to_bytes(8, "big")))
    got = []
    try:
        while sock.poll(5000):
            _, seq, payload = sock.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                return got
            got.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
        pytest.fail("the replay socket did not end its answer")
    finally:
        sock.close(linger=0)


def test_a_bad_config_stops_start_up_naming_it() -> None:
    """ServerArgs refuses it while the flags are read, before any model loads (`radixrt
    launch` then prints the one line and exits 2: tests/unit/test_cli.py)."""
    with pytest.raises(ValueError, match="kv_events_config: enable_kv_cache_events has the wr"):
        ServerArgs(device="cpu", kv_events_config='{"enable_kv_cache_events": 1}')
