"""Fixtures that start `radixrt launch` as a real subprocess on a free loopback port."""

from __future__ import annotations

import openai
import pytest
from launch_helpers import LaunchedServer, launch


@pytest.fixture(scope="module")
def launch_server(tmp_path_factory):
    """Factory `(*cli_args, api_key=None) -> LaunchedServer`; servers stop at module end."""
    servers: list[LaunchedServer] = []

    def start(*args: str, api_key: str | None = None) -> LaunchedServer:
        server = launch(tmp_path_factory.mktemp("server"), *args, api_key=api_key)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def server(launch_server) -> LaunchedServer:
    """The default model in float32 (greedy text is the same whatever the batch); modules that
    need other flags define their own `server`."""
    return launch_server("--dtype", "float32", "--max-total-tokens", "16384",
                         "--log-level", "warning")


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
