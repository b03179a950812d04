"""Starts a scheduler for a frontend: as a child process over ZeroMQ (the default), or on a
thread over in-process queues (tests, notebooks). Either way the frontend gets a transport and
the scheduler's SchedulerReady message."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from radixrt.messages import (
    SchedulerFailed,
    SchedulerReady,
    decode_from_scheduler,
)
from radixrt.server_args import ServerArgs

STARTUP_TIMEOUT_S = 600


class SchedulerStartError(RuntimeError):
    pass


_REraisable = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError,
               "TypeError": TypeError, "NotImplementedError": NotImplementedError}


class SchedulerHandle:
    """What a frontend holds: the transport to the scheduler, its ready info, and liveness."""

    def __init__(self, transport: Any, info: SchedulerReady, alive, stop, close=None,
                 local=None, death=None) -> None:
        self.transport = transport
        self._death = death
        self.info = info
        self._alive = alive
        self._stop = stop
        self._close = close
        self.local_scheduler = local  # the Scheduler object when it runs in this process

    def alive(self) -> bool:
        return self._alive()

    def death_reason(self) -> str:
        """Why the scheduler side is not alive (which process ended, and how)."""
        return self._death() if self._death else "the scheduler thread has ended"

    def stop(self, timeout: float = 30) -> None:
        """Wait for the scheduler (told to shut down) to end; kill it past the timeout."""
        self._stop(timeout)

    def close(self) -> None:
        """Release the transport; only after stop, once nobody reads from it."""
        if self._close is not None:
            self._close()


def start_process(args: ServerArgs) -> tuple[Callable[[], SchedulerHandle], str]:
    """Spawn the scheduler and detokenizer processes now. The scheduler's outputs pass through
    the detokenizer, which adds their text. Returns a function that waits until the scheduler is
    ready (so the caller can load its tokenizer meanwhile) and returns the handle, or raises why
    not; and a folder where the caller may save its loaded tokenizer for the children to use."""
    from radixrt.scheduler.transport import ZmqTransport

    ipc_dir = tempfile.mkdtemp(prefix="radixrt-")
    to_sched, to_detok, from_detok = (f"ipc://{ipc_dir}/{name}"
                                      for name in ("scheduler", "detokenizer", "frontend"))
    transport = ZmqTransport(from_detok, to_sched, bind=True)
    tokenizer_dir = os.path.join(ipc_dir, "tokenizer")
    common = {"server_args": dataclasses.asdict(args), "tokenizer_dir": tokenizer_dir}
    procs = {
        "scheduler": _spawn("radixrt.scheduler.process",
                            {**common, "recv_addr": to_sched, "send_addr": to_detok}),
        "detokenizer": _spawn("radixrt.server.detokenizer_process",
                              {**common, "recv_addr": to_detok, "send_addr": from_detok}),
    }

    def alive() -> bool:
        return all(p.poll() is None for p in procs.values())

    def stop(timeout: float) -> None:
        # The scheduler was told to shut down; the detokenizer has no work or state left
        # after it (and ignores SIGTERM, like the scheduler: the frontend orders the stop).
        _wait_or_kill(procs["scheduler"], timeout)
        procs["detokenizer"].kill()
        procs["detokenizer"].wait()

    def close() -> None:
        transport.close()
        shutil.rmtree(ipc_dir, ignore_errors=True)

    def wait_ready() -> SchedulerHandle:
        try:
            info = _wait_ready(transport, alive)
        except BaseException:
            for p in procs.values():
                p.kill()
                p.wait()
            close()
            raise
        return SchedulerHandle(transport, info, alive, stop, close,
                               death=lambda: _death_reason(procs))

    return wait_ready, tokenizer_dir


def ignore_stop_signals() -> None:
    """In a child: ignore Ctrl-C and a SIGTERM sent to the whole process group; the frontend
    stops its children in order."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _spawn(module: str, config: dict) -> subprocess.Popen:
    """A child running `python -m module`, its config as JSON on stdin (no pickling, and no
    __main__ guard needed in the user's script, unlike multiprocessing's spawn)."""
    proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, text=True)
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
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            dead.append(f"the {name} process (pid {proc.pid}) {how}")
    return "; ".join(dead) or "all processes are running"


def start_thread(args: ServerArgs, tokenizer: Any) -> SchedulerHandle:
    from radixrt.scheduler.components import build_components
    from radixrt.scheduler.scheduler import Scheduler
    from radixrt.scheduler.transport import queue_pair

    front, back = queue_pair()
    scheduler = Scheduler(args, build_components(args, tokenizer), back)
    thread = threading.Thread(target=scheduler.run_forever, daemon=True,
                              name="radixrt-scheduler")
    thread.start()
    return SchedulerHandle(front, scheduler.ready_message(), thread.is_alive,
                           lambda timeout: thread.join(timeout), local=scheduler)


def _wait_ready(transport: Any, alive) -> SchedulerReady:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        for data in transport.recv(timeout=0.5):
            msg = decode_from_scheduler(data)
            if isinstance(msg, SchedulerReady):
                return msg
            if isinstance(msg, SchedulerFailed):
                # Configuration errors keep their type (a missing file, a bad value).
                cls = _REraisable.get(msg.error_type, SchedulerStartError)
                raise cls(msg.error if cls is not SchedulerStartError else
                          f"the scheduler failed to start: {msg.error_type}: {msg.error}")
        if not alive():
            raise SchedulerStartError("a child process exited during startup "
                                      "(see its log above)")
    raise SchedulerStartError(f"the scheduler did not start within {STARTUP_TIMEOUT_S} s")
