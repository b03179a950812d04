"""`radixrt launch`: the serving process.

This process runs the HTTP server and the tokenizer manager (the engine's frontend) on one
asyncio loop (uvloop); the engine starts the scheduler and detokenizer processes, which die with
this one however it ends.

SIGINT or SIGTERM drains, then stops all three: new requests get 503 at once; running ones may
finish for up to --graceful-shutdown-timeout seconds (default 0); the rest then end with an
error (a stream gets an error event and [DONE], a plain request a 503); uvicorn sends those
answers and closes the connections while the children are stopped (killed past a moment). A
second signal ends the wait. If a child dies, every request ends with a 503 naming it and the
server stops the same way, with exit status 1. The process then ends without the interpreter's
teardown (ipc.processes.exit_now).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

import uvicorn

from radixrt.errors import ServerShuttingDown
from radixrt.ipc.processes import exit_now
from radixrt.observability.log_setup import configure_logging, uvicorn_log_config
from radixrt.server_args import ServerArgs

logger = logging.getLogger("radixrt.server")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
FLUSH_TIMEOUT_S = 1.5  # for uvicorn to send the ended requests' answers before it cancels
CHILD_STOP_TIMEOUT_S = 2.0  # for the scheduler to exit by itself before it is killed


def _serve_node(args: ServerArgs) -> int:
    """A node of rank > 0 (--nnodes > 1) runs only its tensor-parallel ranks: node 0 serves
    HTTP and relays every request to them."""
    from radixrt.ipc.processes import node_ranks, serve_node_ranks

    ranks = node_ranks(args)
    logger.info(
        "node %d of %d: tensor-parallel ranks %d..%d, joining %s",
        args.node_rank,
        args.nnodes,
        ranks.start,
        ranks.stop - 1,
        args.dist_init_addr,
    )
    return serve_node_ranks(args)


def launch_server(args: ServerArgs) -> NoReturn:
    """Serve until stopped, then end the process: the exit status is 0 after SIGINT/SIGTERM,
    1 if a child died."""
    exit_now(_serve(args))


def _serve(args: ServerArgs) -> int:
    if args.dp_size > 1:  # N replicas, each a server of its own, for a router (SMG)
        from radixrt.entrypoints.dp_launch import launch_replicas

        return launch_replicas(args)
    from radixrt.loader.tokenizer import keep_torch_out

    keep_torch_out()  # HTTP and tokenizing only: torch stays in the children
    from radixrt.entrypoints.http_server import ServerState, build_app
    from radixrt.entrypoints.metrics import ServerMetrics
    from radixrt.frontend.engine import Engine

    started = time.monotonic()
    configure_logging("frontend", args.log_level)
    if args.node_rank > 0:
        return _serve_node(args)
    _check_port_free(args.host, args.port)  # fail before spending seconds on the model
    engine = Engine(**dataclasses.asdict(args))
    # Started by the drain, so that the children stop while uvicorn sends the answers.
    stopper = threading.Thread(
        target=engine.shutdown, args=(CHILD_STOP_TIMEOUT_S,), name="radixrt-stop", daemon=True
    )
    try:
        name = args.served_model_name or args.model_path or DEFAULT_MODEL_NAME
        state = ServerState(engine, args, name, ServerMetrics(engine.get_stats, name))
        app = build_app(state, lifespan=_lifespan(state, started))
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            log_config=uvicorn_log_config(args.log_level),
            loop="uvloop" if _has_uvloop() else "asyncio",
            access_log=False,  # --log-requests has its own (entrypoints/access_log.py)
            # uvicorn annotates int | None but hands it to asyncio.wait_for, which takes a float.
            timeout_graceful_shutdown=FLUSH_TIMEOUT_S,  # type: ignore[arg-type]
        )
        server = _DrainingServer(config, state, args.graceful_shutdown_timeout, stopper.start)
        failure: list[str] = []

        def on_death(error: Exception) -> None:  # on the engine's dispatcher thread
            failure.append(str(error))
            logger.error("stopping the server: %s", error)
            state.healthy = False
            server.should_exit = True  # the engine has ended every request with the error

        engine.on_death = on_death
        # Once uvicorn is done its signal handlers are put back: these, so that a signal
        # during the children's stop below does not cut it short.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        server.run()
        if failure:
            return 1
        return 0 if server.started else 1
    finally:
        if stopper.ident is not None:
            stopper.join()
        engine.shutdown(timeout=CHILD_STOP_TIMEOUT_S)  # returns at once if the stopper ran


class _DrainingServer(uvicorn.Server):
    """uvicorn's server with radixrt's SIGINT/SIGTERM (see the module docstring): the engine
    refuses new requests at once, and uvicorn's own stop (closing the listener, waiting for
    open connections) starts only once no request is left running, so that every answer goes
    out whole instead of being cut off. Once none is left, `stop_children` starts stopping
    the scheduler side."""

    def __init__(
        self, config: uvicorn.Config, state, grace_s: float, stop_children: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self.state = state
        self.grace_s = grace_s
        self.stop_children = stop_children
        self.drain_until: float | None = None  # the end of the grace period, once signalled
        self._announced = False

    def handle_exit(self, sig: int, frame) -> None:
        # A signal handler: set flags only; on_tick (on the event loop) does the work.
        if not self.started:  # still warming up: nothing to drain, stop once it is done
            self.should_exit = True
        elif self.drain_until is None:
            self.state.healthy = False
            self.state.engine.refuse_new_requests(
                ServerShuttingDown(
                    f"the server is shutting down ({signal.Signals(sig).name}): it takes no new "
                    "requests"
                )
            )
            self.drain_until = time.monotonic() + self.grace_s
        else:
            self.drain_until = 0.0  # a second signal: end the running requests now

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and not self.should_exit:
            self._drain_step(self.drain_until)
        return await super().on_tick(counter)

    def _drain_step(self, drain_until: float) -> None:
        engine = self.state.engine
        if not self._announced:
            self._announced = True
            logger.info(
                "shutting down: new requests get 503; %d running %s",
                engine.num_requests,
                f"may finish within {self.grace_s:g} s" if self.grace_s else "end now",
            )
        if engine.num_requests and time.monotonic() < drain_until:
            return
        ended = engine.end_all_requests(
            ServerShuttingDown(
                "the server is shutting down: the request was ended before it finished"
            )
        )
        if ended:
            logger.warning("shutting down: ended %d running request(s) with an error", ended)
        self.should_exit = True
        self.stop_children()


def _lifespan(state, started: float):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        from radixrt.entrypoints.zmq_frontend import ZmqFrontend

        frontend = ZmqFrontend(state.engine, state.args.host, state.args.api_key)
        state.zmq_address = frontend.address
        task = asyncio.ensure_future(frontend.serve())
        await _warm_up(state.engine)
        state.engine.observer = state.metrics.observe  # counts start after the warm-up
        state.healthy = True
        logger.info(
            "ready: serving at http://%s:%d (start-up %.1f s)",
            state.args.host,
            state.args.port,
            time.monotonic() - started,
        )
        _print_banner(state)
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return lifespan


async def _warm_up(engine) -> None:
    """One tiny request through every process: /health says ok only after a real step."""
    start = time.monotonic()
    ids = [engine.info.eos_token_ids[0] if engine.info.eos_token_ids else 0]
    await engine.async_generate(
        input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0}
    )
    logger.info("warm-up: one request through every process in %.2f s", time.monotonic() - start)


def _print_banner(state) -> None:
    info, args = state.engine.info, state.args
    print(
        f"radixrt {state.served_model_name} serving at http://{args.host}:{args.port} "
        f"(pid {os.getpid()}; scheduler pid {info.pid})\n"
        f"  model: {info.model_path or DEFAULT_MODEL_NAME} ({info.dtype} on {info.device}, "
        f"context {info.context_length})\n"
        f"  KV pool: {info.pool_tokens} tokens, page size {args.page_size}, radix cache "
        f"{'off' if args.disable_radix_cache else 'on'}; attention backend: "
        f"{info.attention_backend}\n"
        f"  ZeroMQ frontend: {state.zmq_address}; API key "
        f"{'required' if args.api_key else 'not required'}",
        flush=True,
    )


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise SystemExit(
                f"cannot serve on {host}:{port}: {e.strerror} (choose another --port or --host)"
            ) from None


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return sys.platform != "win32"
