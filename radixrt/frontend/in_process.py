"""Starts the scheduler side in this process (Engine(in_process=True): tests, notebooks): the
scheduler loop and the detokenizer on threads, over in-process queues laid out as the processes
are (frontend → scheduler → detokenizer → frontend), so that the frontend reads the same
messages, text included, from one path either way. The child-process start is
radixrt/ipc/processes.py."""

from __future__ import annotations

import logging
import threading
from typing import Any

from radixrt.detokenizer.detokenizer import Detokenizer, failure, serve
from radixrt.ipc.processes import SchedulerHandle
from radixrt.ipc.transport import Transport, queue_pipeline
from radixrt.server_args import ServerArgs

logger = logging.getLogger("radixrt.detokenizer")


def start_thread(args: ServerArgs, tokenizer: Any) -> SchedulerHandle:
    """Build the scheduler (loading the model) and start both threads. `tokenizer`: the
    frontend's (None with skip_tokenizer_init: the detokenizer then passes ids on)."""
    from radixrt.scheduler.components import build_components
    from radixrt.scheduler.scheduler import Scheduler

    if args.tp_size > 1:
        raise ValueError(f"tp_size={args.tp_size} needs one process per rank: use in_process=False")
    ends = queue_pipeline()
    scheduler = Scheduler(args, build_components(args, tokenizer), ends.scheduler)
    detok_done = threading.Event()  # set once the scheduler has stopped
    threads = {
        "scheduler": threading.Thread(
            target=scheduler.run_forever, daemon=True, name="radixrt-scheduler"
        ),
        "detokenizer": threading.Thread(
            target=_detokenize,
            args=(ends.detokenizer, Detokenizer(tokenizer), detok_done),
            daemon=True,
            name="radixrt-detokenizer",
        ),
    }
    for thread in threads.values():
        thread.start()

    def alive() -> bool:
        return all(t.is_alive() for t in threads.values())

    def stop(timeout: float) -> None:
        # The scheduler was told to shut down; the detokenizer forwards what it sent last,
        # then ends.
        threads["scheduler"].join(timeout)
        detok_done.set()
        threads["detokenizer"].join(timeout)

    def death() -> str:
        ended = [f"the {name} thread has ended" for name, t in threads.items() if not t.is_alive()]
        return "; ".join(ended) or "all threads are running"

    return SchedulerHandle(
        ends.frontend,
        scheduler.ready_message(),
        alive=alive,
        stop=stop,
        death=death,
        local=scheduler,
    )


def _detokenize(transport: Transport, detok: Detokenizer, done: threading.Event) -> None:
    try:
        serve(transport, detok, done.is_set)
    except BaseException as e:  # as the process does: log it, tell the frontend, end
        logger.exception("detokenizer failed")
        transport.send(failure(e))  # the frontend ends every request with it
