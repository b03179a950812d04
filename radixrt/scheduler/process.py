"""The scheduler as its own process: `python -m radixrt.scheduler.process` reads its config
(JSON: the ServerArgs fields and the two ZeroMQ addresses) from stdin, loads the model, says
ready, and runs the loop until told to shut down.

With tensor parallelism one such process runs per rank (config "tp_rank" and "dist_init"):
each joins the group, rank 0 alone has the ZeroMQ addresses, and the others follow it in
lockstep (scheduler/lockstep.py).

A process of its own keeps the model's OpenMP thread team off the caller's threads: on the CPU,
torch ops run from a second thread of a process whose main thread has used torch are markedly
slower.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import traceback
from typing import Any

from radixrt.ipc.processes import exit_now, guard_parent, ignore_stop_signals
from radixrt.ipc.transport import ZmqTransport
from radixrt.observability.log_setup import configure_logging
from radixrt.protocol.messages import SchedulerFailed, encode
from radixrt.scheduler.lockstep_base import Lockstep, SingleRank
from radixrt.server_args import ServerArgs

logger = logging.getLogger("radixrt.scheduler")


def run(config: dict[str, Any]) -> int:
    started = time.monotonic()
    ignore_stop_signals()
    guard_parent(config["parent_pid"], config.get("ipc_dir"))  # before any thread starts
    args = ServerArgs(**config["server_args"])
    rank = config.get("tp_rank", 0)
    configure_logging("scheduler" if args.tp_size == 1 else f"scheduler TP{rank}", args.log_level)
    transport = (
        ZmqTransport(config["recv_addr"], config["send_addr"], bind=False) if rank == 0 else None
    )
    lockstep: Lockstep = SingleRank()  # until this rank has joined its group
    try:
        from radixrt.loader.tokenizer import LazyTokenizer
        from radixrt.scheduler.components import build_components
        from radixrt.scheduler.lockstep import NullTransport, join_group
        from radixrt.scheduler.scheduler import Scheduler

        # The scheduler matches stop strings and builds grammars with it.
        tokenizer = LazyTokenizer.for_process(
            args.model_path,
            args.tokenizer_path,
            args.skip_tokenizer_init,
            config.get("tokenizer_dir"),
        )
        group, lockstep = join_group(args, rank, config.get("dist_init"))
        parts = build_components(args, tokenizer, group)
        scheduler = Scheduler(args, parts, transport or NullTransport(), lockstep)
        lockstep.join()  # every rank is ready
        if transport is not None:
            transport.send(encode(scheduler.ready_message()))
        logger.info(
            "scheduler%s ready in %.1f s (pid %d)",
            f" rank {rank}" if args.tp_size > 1 else "",
            time.monotonic() - started,
            os.getpid(),
        )
        parent = config["parent_pid"]
        # guard_parent ends this process when the frontend dies, busy or idle; the loop's
        # own check (while idle) is the slower second line.
        scheduler.run_forever(orphaned=lambda: os.getppid() != parent)
        lockstep.close()
        if os.getppid() != parent and config.get("ipc_dir"):
            # The frontend died without cleaning up the folder of our sockets: do it here.
            shutil.rmtree(config["ipc_dir"], ignore_errors=True)
        return 0
    except BaseException as e:  # tell the frontend why, then die
        logger.error("scheduler rank %d failed:\n%s", rank, traceback.format_exc())
        if transport is not None:
            message = lockstep.failure_message(e)
            transport.send(encode(SchedulerFailed(message, type(e).__name__)))
        return 1
    finally:
        if transport is not None:
            transport.close()


if __name__ == "__main__":
    # run() has closed the events, the lockstep and the sockets: skip the interpreter's
    # teardown of torch, which took 1.4-2.3 s of every shutdown (docs/operations.md).
    exit_now(run(json.loads(sys.stdin.read())))
