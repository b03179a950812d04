"""Starts a scheduler for a frontend: as a child process over ZeroMQ (the default), or on a
thread over in-process queues (tests, notebooks). Either way the frontend gets a transport and
the scheduler's SchedulerReady message."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
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
                 local=None) -> None:
        self.transport = transport
        self.info = info
        self._alive = alive
        self._stop = stop
        self._close = close
        self.local_scheduler = local  # the Scheduler object when it runs in this process

    def alive(self) -> bool:
        return self._alive()

    def stop(self, timeout: float = 30) -> None:
        """Wait for the scheduler (told to shut down) to end; kill it past the timeout."""
        self._stop(timeout)

    def close(self) -> None:
        """Release the transport; only after stop, once nobody reads from it."""
        if self._close is not None:
            self._close()


def start_process(args: ServerArgs) -> tuple[Callable[[], SchedulerHandle], str]:
    """Spawn the scheduler process now. Returns a function that waits until it is ready (so
    the caller can load its tokenizer meanwhile) and returns the handle, or raises why not;
    and a folder where the caller may save its loaded tokenizer for the scheduler to use."""
    from radixrt.scheduler.transport import ZmqTransport

    ipc_dir = tempfile.mkdtemp(prefix="radixrt-")
    to_sched, from_sched = f"ipc://{ipc_dir}/in", f"ipc://{ipc_dir}/out"
    transport = ZmqTransport(from_sched, to_sched, bind=True)
    tokenizer_dir = os.path.join(ipc_dir, "tokenizer")
    config = {"server_args": dataclasses.asdict(args), "recv_addr": to_sched,
              "send_addr": from_sched, "tokenizer_dir": tokenizer_dir}
    proc = subprocess.Popen([sys.executable, "-m", "radixrt.scheduler.process"],
                            stdin=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps(config))
    proc.stdin.close()

    def stop(timeout: float) -> None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close() -> None:
        transport.close()
        shutil.rmtree(ipc_dir, ignore_errors=True)

    def wait_ready() -> SchedulerHandle:
        try:
            info = _wait_ready(transport, lambda: proc.poll() is None)
        except BaseException:
            proc.kill()
            stop(5)
            close()
            raise
        return SchedulerHandle(transport, info, lambda: proc.poll() is None, stop, close)

    return wait_ready, tokenizer_dir


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
            raise SchedulerStartError("the scheduler process exited during startup "
                                      "(see its log above)")
    raise SchedulerStartError(f"the scheduler did not start within {STARTUP_TIMEOUT_S} s")
