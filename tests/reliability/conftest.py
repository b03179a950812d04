"""Fixtures for the fault suite: real `radixrt launch` processes on loopback.

`shared_server` is the run's default-model server (tests/conftest.py: float32, the KV accounting
check after every step): tests that only send requests use it, and `assert_pool_conserved`
checks after them that no request still holds a token. Tests that kill, stop or reconfigure a
server start their own with `launch_server` (the churn test: a tiny model on a pool small
enough to preempt).
"""

from __future__ import annotations

import launch_helpers
import pytest
from launch_helpers import LaunchedServer, assert_pool_conserved

launch_server = launch_helpers.launch_server  # the fixture, for this folder's tests


@pytest.fixture(scope="session")
def shared_server(default_server) -> LaunchedServer:
    return default_server


@pytest.fixture
def pool_conserved(shared_server):
    """Use in a test on the shared server: after it, the pool is whole and the server healthy."""
    yield shared_server
    assert_pool_conserved(shared_server)
