"""The one log format, the access-log middleware (entrypoints/access_log.py)
and the weight-loading progress lines (models/load_progress.py), without a server."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from radixrt.entrypoints.access_log import add_access_log
from radixrt.models.load_progress import WeightProgress
from radixrt.observability.log_setup import (
    configure_default_logging,
    configure_logging,
    format_bytes,
    logging_config,
)

LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (\w+)\] (\w+) ([\w.]+): (.*)$")


@pytest.fixture
def restore_logging():
    """configure_logging replaces the root's handlers, pytest's capture among them."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_the_format_names_time_role_level_and_logger(restore_logging, capsys):
    configure_logging("scheduler", "info")
    logging.getLogger("radixrt.scheduler").info("KV pool: %d tokens", 64)
    logging.getLogger("uvicorn.error").info("Started server process")
    logging.getLogger("radixrt.x").debug("not shown at info")
    lines = capsys.readouterr().err.splitlines()
    assert [LINE.match(line).groups() for line in lines] == [  # type: ignore[union-attr]
        ("scheduler", "INFO", "radixrt.scheduler", "KV pool: 64 tokens"),
        ("scheduler", "INFO", "uvicorn.error", "Started server process"),
    ]


def test_the_default_set_up_keeps_an_application_s_own_handlers(restore_logging):
    root = logging.getLogger()
    root.handlers[:] = []
    configure_default_logging("frontend", "info")  # nothing set up yet: the format
    assert len(root.handlers) == 1
    mine = logging.StreamHandler()
    root.handlers[:] = [mine]
    configure_default_logging("frontend", "debug")  # the application's handler stays
    assert root.handlers == [mine]


def test_a_bad_level_is_refused_by_name():
    with pytest.raises(ValueError, match="log_level must be one of"):
        logging_config("frontend", "loud")


def test_format_bytes():
    assert format_bytes(3 * (1 << 20)) == "3.0 MiB"
    assert format_bytes(5 * (1 << 30)) == "5.00 GiB"


def access_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        return {"n": len(await request.body())}

    @app.get("/stream")
    async def stream():
        async def chunks():
            for _ in range(3):
                await asyncio.sleep(0.05)
                yield b"x"

        return StreamingResponse(chunks())

    @app.get("/boom")
    async def boom():
        raise RuntimeError("boom")

    add_access_log(app, enabled=True)
    return app


async def _requests() -> None:
    transport = httpx.ASGITransport(app=access_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        headers = {"Authorization": "Bearer sekrit-key"}
        await client.post("/echo?q=1", content=b"the secret prompt", headers=headers)
        await client.get("/stream")
        await client.get("/boom")
        await client.get("/missing")


def test_access_lines_say_who_what_status_and_time_but_no_secret(caplog):
    with caplog.at_level(logging.INFO, logger="radixrt.access"):
        asyncio.run(_requests())
    lines = [r.getMessage() for r in caplog.records if r.name == "radixrt.access"]
    pattern = re.compile(r'^127\.0\.0\.1:123 "(\w+) (\S+)" (\d{3}) ([\d.]+) ms$')
    parsed = [pattern.match(line).groups() for line in lines]  # type: ignore[union-attr]
    assert [p[:3] for p in parsed] == [
        ("POST", "/echo", "200"),
        ("GET", "/stream", "200"),
        ("GET", "/boom", "500"),
        ("GET", "/missing", "404"),
    ]
    assert float(parsed[1][3]) >= 150, "a stream's time runs to its last chunk"
    assert "sekrit" not in caplog.text and "secret prompt" not in caplog.text


def test_no_access_log_unless_enabled():
    app = FastAPI()
    add_access_log(app, enabled=False)
    assert app.user_middleware == []


def test_weight_progress_logs_each_quarter_once(caplog):
    with caplog.at_level(logging.INFO, logger="radixrt.loader"):
        progress = WeightProgress(10)
        for _ in range(10):
            progress.advance()
    assert [r.getMessage() for r in caplog.records] == [
        "loading weights: 30% (3/10 tensors)",
        "loading weights: 50% (5/10 tensors)",
        "loading weights: 80% (8/10 tensors)",
    ]


def test_weight_progress_is_quiet_above_info(caplog):
    with caplog.at_level(logging.WARNING, logger="radixrt.loader"):
        progress = WeightProgress(4)
        for _ in range(4):
            progress.advance()
    assert caplog.records == []
