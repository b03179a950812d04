"""`radixrt launch`: the serving process.

This process runs the HTTP server and the tokenizer manager (the engine's frontend) on one
asyncio loop (uvloop); the engine starts the scheduler and detokenizer processes. SIGINT or
SIGTERM stops all three in order; if a child dies, the server stops with an error naming it.
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

from radixrt.server_args import ServerArgs

logger = logging.getLogger("radixrt.server")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def launch_server(args: ServerArgs) -> int:
    """Serve until stopped; the exit status is 0 after SIGINT/SIGTERM, 1 if a child died."""
    import uvicorn

    from radixrt.engine import Engine
    from radixrt.server.http_server import ServerState, build_app
    from radixrt.server.metrics import ServerMetrics

    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(message)s")
    _check_port_free(args.host, args.port)  # fail before spending seconds on the model
    engine = Engine(**dataclasses.asdict(args))
    try:
        name = args.served_model_name or args.model_path or DEFAULT_MODEL_NAME
        state = ServerState(engine, args, name, ServerMetrics(engine.get_stats, name))
        app = build_app(state, lifespan=_lifespan(state))
        server = uvicorn.Server(uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level,
            loop="uvloop" if _has_uvloop() else "asyncio", access_log=False,
            timeout_graceful_shutdown=5))
        failure: list[str] = []

        def on_death(error: Exception) -> None:
            failure.append(str(error))
            logger.error("stopping the server: %s", error)
            server.should_exit = True

        engine.on_death = on_death
        # uvicorn turns SIGINT/SIGTERM into a graceful stop, then re-raises the signal under
        # the handler it found: make that one a no-op so that the engine below still shuts the
        # scheduler and detokenizer down in order.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        server.run()
        if failure:
            return 1
        return 0 if server.started else 1
    finally:
        engine.shutdown()


def _lifespan(state):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        from radixrt.server.zmq_frontend import ZmqFrontend

        frontend = ZmqFrontend(state.engine, state.args.host, state.args.api_key)
        state.zmq_address = frontend.address
        task = asyncio.ensure_future(frontend.serve())
        await _warm_up(state.engine)
        state.engine.observer = state.metrics.observe  # counts start after the warm-up
        state.healthy = True
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
    ids = [engine.info.eos_token_ids[0] if engine.info.eos_token_ids else 0]
    await engine.async_generate(input_ids=ids, sampling_params={"max_new_tokens": 1,
                                                                 "temperature": 0})


def _print_banner(state) -> None:
    info, args = state.engine.info, state.args
    print(f"radixrt {state.served_model_name} serving at http://{args.host}:{args.port} "
          f"(pid {os.getpid()}; scheduler pid {info.pid})\n"
          f"  model: {info.model_path or DEFAULT_MODEL_NAME} ({info.dtype} on {info.device}, "
          f"context {info.context_length})\n"
          f"  KV pool: {info.pool_tokens} tokens, page size {args.page_size}, radix cache "
          f"{'off' if args.disable_radix_cache else 'on'}; attention backend: "
          f"{info.attention_backend}\n"
          f"  ZeroMQ frontend: {state.zmq_address}; API key "
          f"{'required' if args.api_key else 'not required'}", flush=True)


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise SystemExit(f"cannot serve on {host}:{port}: {e.strerror} "
                             "(choose another --port or --host)") from None


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return sys.platform != "win32"
