"""The detokenizer as its own process: `python -m radixrt.detokenizer.process`.

It sits between the scheduler and the frontend: it turns each request's new token ids into a
text delta (detokenizer/detokenizer.py: no split UTF-8 character, no stop string, not even part of
one), fills `ReqOutput.text`, and forwards every message on. Its config (JSON on stdin): the
ServerArgs fields, the address it binds to receive from the scheduler, the frontend's address,
and the folder where the frontend saves its tokenizer.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from radixrt.detokenizer.detokenizer import Detokenizer, failure, serve
from radixrt.ipc.processes import guard_parent, ignore_stop_signals
from radixrt.ipc.transport import ZmqTransport
from radixrt.observability.log_setup import configure_logging

logger = logging.getLogger("radixrt.detokenizer")


def run(config: dict) -> int:
    ignore_stop_signals()
    # It exits when the frontend dies (or kills it after the scheduler): it never has to
    # look up from the socket.
    guard_parent(config["parent_pid"], config.get("ipc_dir"))  # before any thread starts
    args = config["server_args"]
    configure_logging("detokenizer", args["log_level"])
    transport = ZmqTransport(config["recv_addr"], config["send_addr"], bind=True, bind_send=False)
    try:
        from radixrt.loader.tokenizer import LazyTokenizer

        serve(
            transport,
            Detokenizer(
                LazyTokenizer.for_process(
                    args["model_path"],
                    args["tokenizer_path"],
                    args["skip_tokenizer_init"],
                    config.get("tokenizer_dir"),
                    decode_only=True,
                )
            ),
        )
        return 0
    except BaseException as e:  # tell the frontend why, then die
        logger.error("detokenizer failed:\n%s", traceback.format_exc())
        transport.send(failure(e))
        return 1
    finally:
        transport.close()


if __name__ == "__main__":
    sys.exit(run(json.loads(sys.stdin.read())))
