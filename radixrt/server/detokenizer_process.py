"""The detokenizer as its own process: `python -m radixrt.server.detokenizer_process`.

It sits between the scheduler and the frontend: it turns each request's new token ids into a
text delta (IncrementalDetokenizer: no split UTF-8 character, no stop string, not even part of
one), fills `ReqOutput.text`, and forwards every message on. Its config (JSON on stdin): the
ServerArgs fields, the address it binds to receive from the scheduler, the frontend's address,
and the folder where the frontend saves its tokenizer.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from typing import Any

from radixrt.detokenizer import IncrementalDetokenizer
from radixrt.messages import (
    BatchOutput,
    DetokParams,
    ReqOutput,
    SchedulerFailed,
    decode_from_scheduler,
    encode,
)
from radixrt.scheduler.launcher import guard_parent, ignore_stop_signals
from radixrt.scheduler.transport import ZmqTransport

logger = logging.getLogger("radixrt.detokenizer")


class Detokenizer:
    """Per-request incremental state, created at a request's first output, dropped at its last."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}

    def fill(self, out: ReqOutput) -> None:
        state = self.states.get(out.rid)
        if state is None:
            p = out.detok or DetokParams()
            state = IncrementalDetokenizer(self.tokenizer, p.skip_special_tokens,
                                           p.spaces_between_special_tokens, p.stop,
                                           p.no_stop_trim, p.stop_regex)
            self.states[out.rid] = state
        if out.finished:
            out.text = state.finish(out.new_output_ids, out.finish_reason)
            del self.states[out.rid]
        else:
            out.text = state.add(out.new_output_ids)

    def process(self, data: bytes) -> bytes:
        """One message from the scheduler → the message for the frontend."""
        if self.tokenizer is None:
            return data  # token ids only: nothing to do
        msg = decode_from_scheduler(data)
        if not isinstance(msg, BatchOutput):
            return data
        for out in msg.outputs:
            self.fill(out)
        return encode(msg)


def run(config: dict) -> int:
    ignore_stop_signals()
    # It exits when the frontend dies (or kills it after the scheduler): it never has to
    # look up from the socket.
    guard_parent(config["parent_pid"], config.get("ipc_dir"))  # before any thread starts
    args = config["server_args"]
    logging.basicConfig(level=args["log_level"].upper(),
                        format="[%(asctime)s detokenizer] %(message)s")
    transport = ZmqTransport(config["recv_addr"], config["send_addr"], bind=True,
                             bind_send=False)
    try:
        from radixrt.loader.tokenizer import LazyTokenizer

        detok = Detokenizer(LazyTokenizer.for_process(
            args["model_path"], args["tokenizer_path"], args["skip_tokenizer_init"],
            config.get("tokenizer_dir")))
        while True:
            for data in transport.recv(timeout=None):
                transport.send(detok.process(data))
    except BaseException as e:  # tell the frontend why, then die
        logger.error("detokenizer failed:\n%s", traceback.format_exc())
        transport.send(encode(SchedulerFailed(f"the detokenizer failed: {e}",
                                              type(e).__name__)))
        return 1
    finally:
        transport.close()


if __name__ == "__main__":
    sys.exit(run(json.loads(sys.stdin.read())))
