"""Fixtures that start `radixrt launch` as a real subprocess on a free loopback port."""

from __future__ import annotations

import launch_helpers
import openai
import pytest
from launch_helpers import LaunchedServer

launch_server = launch_helpers.launch_server  # the fixture, for this folder's tests


@pytest.fixture(scope="module")
def server(default_server) -> LaunchedServer:
    """The run's default-model server (tests/conftest.py); modules that need other flags
    define their own `server`."""
    return default_server


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
