"""Fixtures that start `radixrt launch` as a real subprocess on a free loopback port."""

from __future__ import annotations

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
