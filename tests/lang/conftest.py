"""A default-model server shared by the DSL tests, and both kinds of backend over it."""

from __future__ import annotations

import pytest
from launch_helpers import LaunchedServer

import radixrt as rt


@pytest.fixture(scope="session")
def lang_server(default_server) -> LaunchedServer:
    """The run's default-model server (tests/conftest.py: float32, KV checks on)."""
    return default_server


@pytest.fixture(scope="session")
def endpoint(lang_server) -> rt.RuntimeEndpoint:
    backend = rt.RuntimeEndpoint(lang_server.url)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="session")
def engine_backend() -> rt.EngineBackend:
    """The in-process backend (an Engine in the test process, its scheduler on a thread)."""
    backend = rt.EngineBackend(dtype="float32", in_process=True, enable_kv_checks=True)
    yield backend
    backend.engine.shutdown()


@pytest.fixture(params=["endpoint", "engine"])
def backend(request) -> rt.Backend:
    """Each DSL test runs on a real server over ZeroMQ and on the in-process backend."""
    return request.getfixturevalue("endpoint" if request.param == "endpoint" else "engine_backend")
