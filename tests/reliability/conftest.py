"""Fixtures for the fault suite: real `radixrt launch` processes on loopback.

`shared_server` is one server for the whole folder (the default model, a KV pool small enough
for preemption, the KV accounting check after every step): tests that only send requests use
it, and `assert_pool_conserved` checks after them that no request still holds a token. Tests
that kill, stop or reconfigure a server start their own with `launch_server`.
"""

from __future__ import annotations

import time

import httpx
import launch_helpers
import pytest
from launch_helpers import LaunchedServer, launch

launch_server = launch_helpers.launch_server  # the fixture, for this folder's tests

SHARED_ARGS = ("--dtype", "float32", "--max-total-tokens", "3072", "--enable-kv-checks",
               "--max-running-requests", "16", "--log-level", "warning")


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory) -> LaunchedServer:
    server = launch(tmp_path_factory.mktemp("shared"), *SHARED_ARGS)
    yield server
    server.stop()


def server_stats(server: LaunchedServer) -> dict:
    """/server_info: the scheduler's counters (running, queued, free and evictable tokens)."""
    r = httpx.get(server.url + "/server_info", headers=server.headers, timeout=30)
    r.raise_for_status()
    return r.json()


def assert_pool_conserved(server: LaunchedServer, timeout_s: float = 30) -> None:
    """Once the server is idle, no request holds a token: free + cached == the pool, and the
    server still answers /health."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = server_stats(server)
        idle = info["running"] == 0 and info["queued"] == 0 and info["grammar_queue"] == 0
        held = info["max_total_num_tokens"] - info["free_tokens"] - info["evictable_tokens"]
        if idle and held == 0:
            break
        assert time.monotonic() < deadline, f"requests still hold KV after {timeout_s} s: {info}"
        time.sleep(0.2)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


@pytest.fixture
def pool_conserved(shared_server):
    """Use in a test on the shared server: after it, the pool is whole and the server healthy."""
    yield shared_server
    assert_pool_conserved(shared_server)
