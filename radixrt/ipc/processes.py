"""Starts the scheduler and detokenizer processes for a frontend, and keeps them tied to it.

Torch-free: the HTTP process imports this, and must not import the scheduler, the model or the
cache (tests/server/test_frontend_imports.py). The in-process start (both parts on threads) is
radixrt/frontend/in_process.py. Either way the frontend gets a SchedulerHandle: a transport, the
scheduler's SchedulerReady message, and liveness."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import glob
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from radixrt.errors import SchedulerStartError
from radixrt.ipc.transport import Transport, ZmqTransport
from radixrt.protocol.messages import (
    SchedulerFailed,
    SchedulerReady,
    ShutdownReq,
    decode_from_scheduler,
    encode,
)
from radixrt.server_args import ServerArgs

STARTUP_TIMEOUT_S = 600
IPC_PREFIX = "radixrt-"  # socket folders in the temp dir: radixrt-<owner pid>-<random>
PARENT_POLL_S = 0.5  # how often a child checks that its parent is alive
_LOCK_NAME = "owner.lock"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PARENT_DEATH_SIGNAL = signal.SIGUSR1  # what the kernel sends a child when its parent dies


_REraisable = {
    "ValueError": ValueError,
    "FileNotFoundError": FileNotFoundError,
    "TypeError": TypeError,
    "NotImplementedError": NotImplementedError,
}


class SchedulerHandle:
    """What a frontend holds: the transport to the scheduler side (whose messages come through
    the detokenizer), the scheduler's ready info, and liveness. `death()` says which part
    ended, and how; `local` is the Scheduler object when it runs in this process."""

    def __init__(
        self,
        transport: Transport,
        info: SchedulerReady,
        *,
        alive: Callable[[], bool],
        stop: Callable[[float], None],
        death: Callable[[], str],
        close: Callable[[], None] | None = None,
        local: Any = None,
    ) -> None:
        self.transport = transport
        self.info = info
        self._alive = alive
        self._stop = stop
        self._death = death
        self._close = close
        self.local_scheduler = local

    def alive(self) -> bool:
        """Whether every part (scheduler and detokenizer) is still running."""
        return self._alive()

    def death_reason(self) -> str:
        """Why the scheduler side is not alive (which part ended, and how)."""
        return self._death()

    def stop(self, timeout: float = 30) -> None:
        """Wait for the scheduler (told to shut down) to end; kill it past the timeout, or at
        once when a child has died (the survivor has nothing left to do)."""
        self._stop(timeout)

    def close(self) -> None:
        """Release the transport; only after stop, once nobody reads from it."""
        if self._close is not None:
            self._close()


def start_process(args: ServerArgs) -> tuple[Callable[[], SchedulerHandle], str]:
    """Spawn the scheduler and detokenizer processes now. The scheduler's outputs pass through
    the detokenizer, which adds their text. Returns a function that waits until the scheduler is
    ready (so the caller can load its tokenizer meanwhile) and returns the handle, or raises why
    not; and a folder where the caller may save its loaded tokenizer for the children to use.

    The children die with this process however it ends (guard_parent). Their sockets live in
    a folder of the temp dir, radixrt-<pid>-*, which this process holds a lock on: it removes
    it in close(), an orphaned child removes it, and a later start removes any left behind."""
    remove_stale_ipc_dirs()
    ipc_dir = tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-")
    lock_fd = _lock_owner(ipc_dir)
    to_sched, to_detok, from_detok = (
        f"ipc://{ipc_dir}/{name}" for name in ("scheduler", "detokenizer", "frontend")
    )
    transport = ZmqTransport(from_detok, to_sched, bind=True)
    tokenizer_dir = os.path.join(ipc_dir, "tokenizer")
    common = {
        "server_args": dataclasses.asdict(args),
        "tokenizer_dir": tokenizer_dir,
        "ipc_dir": ipc_dir,
        "parent_pid": os.getpid(),
    }
    procs = {
        **_spawn_ranks(args, common, {"recv_addr": to_sched, "send_addr": to_detok}),
        "detokenizer": _spawn(
            "radixrt.detokenizer.process",
            {**common, "recv_addr": to_detok, "send_addr": from_detok},
        ),
    }

    def alive() -> bool:
        return all(p.poll() is None for p in procs.values())

    def stop(timeout: float) -> None:
        # The scheduler (every rank: rank 0 relays the stop) was told to shut down; the
        # detokenizer has no work or state left after it (and ignores SIGTERM, like the
        # scheduler: the frontend orders the stop). Once one of them has died, the others
        # have nothing left to do either.
        deadline = time.monotonic() + (timeout if alive() else 0)
        for name, proc in procs.items():
            if name != "detokenizer":
                _wait_or_kill(proc, max(deadline - time.monotonic(), 0))
        procs["detokenizer"].kill()
        procs["detokenizer"].wait()

    def close() -> None:
        transport.close(linger_s=0)  # after stop: no child is left to take a message
        shutil.rmtree(ipc_dir, ignore_errors=True)
        os.close(lock_fd)

    def wait_ready() -> SchedulerHandle:
        try:
            info = _wait_ready(transport, alive, lambda: _death_reason(procs))
        except BaseException:
            for p in procs.values():
                p.kill()
                p.wait()
            close()
            raise
        return SchedulerHandle(
            transport, info, alive=alive, stop=stop, close=close, death=lambda: _death_reason(procs)
        )

    return wait_ready, tokenizer_dir


def _spawn_ranks(args: ServerArgs, common: dict, rank0: dict) -> dict[str, subprocess.Popen]:
    """This node's scheduler processes: one, or one per tensor-parallel rank (rank 0, on node
    0, gets the frontend's addresses in `rank0`); named as liveness reports them."""
    if args.tp_size == 1:
        return {"scheduler": _spawn("radixrt.scheduler.process", {**common, **rank0})}
    init = f"tcp://{_rendezvous(args)}"
    procs = {}
    for rank in node_ranks(args):
        config = {**common, "tp_rank": rank, "dist_init": init, **(rank0 if rank == 0 else {})}
        procs[f"scheduler rank {rank}"] = _spawn("radixrt.scheduler.process", config)
    return procs


def node_ranks(args: ServerArgs) -> range:
    """The tensor-parallel ranks this node runs (--tp-size split evenly over --nnodes)."""
    if args.tp_size % args.nnodes:
        raise ValueError(
            f"tp_size ({args.tp_size}) must be a multiple of nnodes ({args.nnodes}): "
            "each node runs as many ranks"
        )
    per_node = args.tp_size // args.nnodes
    return range(args.node_rank * per_node, (args.node_rank + 1) * per_node)


def _rendezvous(args: ServerArgs) -> str:
    """HOST:PORT where the ranks meet: --dist-init-addr, or (one node) a free loopback port."""
    if args.dist_init_addr is not None:
        host, sep, port = args.dist_init_addr.rpartition(":")
        if not (host and sep and port.isdigit()):
            raise ValueError(f"dist_init_addr must be HOST:PORT, got {args.dist_init_addr!r}")
        return args.dist_init_addr
    if args.nnodes > 1:
        raise ValueError("dist_init_addr (HOST:PORT of node 0) is required with nnodes > 1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def serve_node_ranks(args: ServerArgs) -> int:
    """`radixrt launch` on a node of rank > 0: run this node's tensor-parallel ranks (no HTTP
    server; node 0's rank 0 relays to them) until one ends; then stop the others. Returns 0
    if every rank ended cleanly (node 0 shut the group down), else 1."""
    common = {"server_args": dataclasses.asdict(args), "parent_pid": os.getpid()}
    procs = _spawn_ranks(args, common, {})
    ended = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: ended.set())
    while not ended.is_set() and all(p.poll() is None for p in procs.values()):
        ended.wait(PARENT_POLL_S)
    failed = any(p.poll() not in (None, 0) for p in procs.values())
    if failed:
        print(f"radixrt: {_death_reason(procs)}", file=sys.stderr, flush=True)
    for proc in procs.values():
        _wait_or_kill(proc, 0 if failed or ended.is_set() else 10)
    return 1 if failed else 0


def abandon(wait_ready: Callable[[], SchedulerHandle]) -> None:
    """Stop a scheduler process that is no longer wanted (its frontend failed to start)."""
    try:
        handle = wait_ready()
    except Exception:
        return  # it failed by itself and is cleaned up
    handle.transport.send(encode(ShutdownReq()), block=False)
    handle.stop(timeout=10)
    handle.close()


def exit_now(code: int) -> NoReturn:
    """End this process with `code` once its logs and output are flushed, skipping the
    interpreter's teardown: freeing every module one by one (torch, transformers) takes
    seconds on a busy machine, and a process that has stopped its children and closed its
    sockets has nothing left that needs it (the kernel frees its memory at once)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def ignore_stop_signals() -> None:
    """In a child: ignore Ctrl-C and a SIGTERM sent to the whole process group; the frontend
    stops its children in order."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def guard_parent(
    parent_pid: int, cleanup_dir: str | None = None, poll_s: float = PARENT_POLL_S
) -> None:
    """In a child, first thing (before any other thread starts): exit as soon as the parent
    `parent_pid` is gone, however it died (kill -9 skips every cleanup), removing
    `cleanup_dir`. On Linux the kernel signals the parent's death (PR_SET_PDEATHSIG); a
    thread also checks the parent every `poll_s` seconds, busy or idle, which covers the
    other platforms and a signal that fires when the parent's thread (not process) ends."""
    watch_signal = None
    if sys.platform.startswith("linux"):
        watch_signal = _PARENT_DEATH_SIGNAL
        # Blocked in every thread (they inherit the mask), so that only the watcher's
        # sigtimedwait takes it: no handler has to run on a main thread busy in a forward.
        signal.pthread_sigmask(signal.SIG_BLOCK, {watch_signal})
        with contextlib.suppress(OSError, AttributeError):  # the polling below still notices
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(watch_signal))
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        _exit_orphaned(cleanup_dir)
    threading.Thread(
        target=_watch_parent,
        args=(parent_pid, cleanup_dir, poll_s, watch_signal),
        daemon=True,
        name="radixrt-parent-watch",
    ).start()


def _watch_parent(
    parent_pid: int, cleanup_dir: str | None, poll_s: float, watch_signal: signal.Signals | None
) -> None:
    while True:
        if watch_signal is not None:
            signal.sigtimedwait({watch_signal}, poll_s)
        else:
            time.sleep(poll_s)
        if os.getppid() != parent_pid:
            _exit_orphaned(cleanup_dir)


def _exit_orphaned(cleanup_dir: str | None) -> None:
    print(
        f"[radixrt {os.getpid()}] the parent process is gone: exiting", file=sys.stderr, flush=True
    )
    if cleanup_dir is not None:
        shutil.rmtree(cleanup_dir, ignore_errors=True)
    os._exit(1)


def remove_stale_ipc_dirs(temp_dir: str | None = None) -> list[str]:
    """Remove the socket folders (radixrt-<pid>-*) of servers and engines that are gone: their
    owner's lock on the folder is free. Returns the folders removed."""
    removed = []
    for path in glob.glob(os.path.join(temp_dir or tempfile.gettempdir(), f"{IPC_PREFIX}*-*")):
        lock = os.path.join(path, _LOCK_NAME)
        if not re.fullmatch(rf"{IPC_PREFIX}\d+-\w+", os.path.basename(path)) or not os.path.isfile(
            lock
        ):
            continue
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner is alive
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _lock_owner(ipc_dir: str) -> int:
    """Hold a lock on the folder for as long as this process lives (the kernel drops it
    however the process ends); the fd is not inherited by children."""
    staging = os.path.join(ipc_dir, f".{_LOCK_NAME}")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(staging, os.path.join(ipc_dir, _LOCK_NAME))  # only ever seen locked
    return fd


def _spawn(module: str, config: dict) -> subprocess.Popen:
    """A child running `python -m module`, its config as JSON on stdin (no pickling, and no
    __main__ guard needed in the user's script, unlike multiprocessing's spawn)."""
    proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, text=True)
    assert proc.stdin is not None  # stdin=PIPE
    proc.stdin.write(json.dumps(config))
    proc.stdin.close()
    return proc


def _wait_or_kill(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _death_reason(procs: dict[str, subprocess.Popen]) -> str:
    """Which child has exited, and how (for the error that stops the frontend)."""
    dead = []
    for name, proc in procs.items():
        code = proc.poll()
        if code is not None:
            # "scheduler rank 1 (pid N) was killed by signal 9", "the detokenizer process ..."
            who = name if "rank" in name else f"the {name} process"
            dead.append(f"{who} (pid {proc.pid}) {_how(code)}")
    return "; ".join(dead) or "all processes are running"


def _how(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}"


def _wait_ready(
    transport: Transport, alive: Callable[[], bool], death: Callable[[], str]
) -> SchedulerReady:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        for data in transport.recv(timeout=0.5):
            msg = decode_from_scheduler(data)
            if isinstance(msg, SchedulerReady):
                return msg
            if isinstance(msg, SchedulerFailed):
                # Configuration errors keep their type (a missing file, a bad value).
                cls = _REraisable.get(msg.error_type, SchedulerStartError)
                raise cls(
                    msg.error
                    if cls is not SchedulerStartError
                    else f"the scheduler failed to start: {msg.error_type}: {msg.error}"
                )
        if not alive():
            raise SchedulerStartError(
                f"a child process exited during startup: {death()} (see its log above)"
            )
    raise SchedulerStartError(f"the scheduler did not start within {STARTUP_TIMEOUT_S} s")
