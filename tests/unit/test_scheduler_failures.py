"""A scheduler on a tiny random model, driven step by step in this thread: a request that
cannot go on ends alone (finish reason abort, a message; its KV released) while the request
beside it decodes exactly as it does alone; raw messages that skip the frontend's checks are
refused with an abort message, never a crash; a compile past --grammar-compile-timeout ends
its request; a message that does not decode is dropped."""

from __future__ import annotations

import time
from concurrent.futures import Future

import msgspec
import pytest

from radixrt.protocol.messages import (
    BatchOutput,
    Bootstrap,
    GenerateReq,
    decode_from_scheduler,
    encode,
)
from radixrt.server_args import ServerArgs


@pytest.fixture(scope="module")
def scheduler_and_outbox(tiny_model_dir):
    from radixrt.ipc.transport import queue_pair
    from radixrt.loader.tokenizer import load_tokenizer
    from radixrt.scheduler.components import build_components
    from radixrt.scheduler.scheduler import Scheduler

    path = tiny_model_dir("llama")
    args = ServerArgs(
        model_path=path,
        dtype="float32",
        max_total_tokens=512,
        enable_kv_checks=True,
        grammar_compile_timeout=5.0,
        max_logprobs=5,
        max_logprob_entries=1000,
    )
    front, back = queue_pair()
    return Scheduler(args, build_components(args, load_tokenizer(path)), back), front


def run(scheduler, front, *msgs: GenerateReq) -> dict[str, dict]:
    """Hand the messages to the scheduler, step until it is idle; rid -> its last output
    (with every output id of the request)."""
    for msg in msgs:
        scheduler.handle(msg)
    deadline = time.monotonic() + 60
    while scheduler.running or scheduler.waiting or scheduler.structured.compiling:
        assert time.monotonic() < deadline, "the scheduler did not finish"
        scheduler._take_turn(0)  # what arrived (nothing here) and the compiled grammars
        if scheduler.running or scheduler.waiting:
            scheduler.step()
    outs: dict[str, dict] = {}
    for data in front.recv(timeout=0.1):
        msg = decode_from_scheduler(data)
        if isinstance(msg, BatchOutput):
            for out in msg.outputs:
                ids = outs.get(out.rid, {}).get("ids", []) + out.new_output_ids
                outs[out.rid] = {"ids": ids, "finish": out.finish_reason}
    return outs


def req(rid: str, ids: list[int], **params) -> GenerateReq:
    return GenerateReq(rid, ids, {"temperature": 0, "max_new_tokens": 8, **params})


def test_a_request_that_cannot_go_on_ends_alone(scheduler_and_outbox):
    scheduler, front = scheduler_and_outbox
    alone = run(scheduler, front, req("alone", [72, 105, 33]))["alone"]
    a = scheduler.parts.tokenizer.encode("a", add_special_tokens=False)[0]
    outs = run(
        scheduler,
        front,
        req("beside", [72, 105, 33]),
        req("banned", [83, 97, 121], regex="a", min_new_tokens=5),
        req("streamed", [83, 97, 121, 58], regex="a", min_new_tokens=5),
    )
    assert outs["beside"] == alone
    for rid in ("banned", "streamed"):
        assert outs[rid]["ids"] == [a]
        assert outs[rid]["finish"]["type"] == "abort"
        assert "min_new_tokens=5 bans the end of sequence" in outs[rid]["finish"]["message"]
    assert scheduler.get_stats()["failed_requests"] >= 2
    scheduler.check_kv()
    assert not scheduler.running


@pytest.mark.parametrize(
    "msg,words",
    [
        (GenerateReq("r", [1, 10**6], {}), "input_ids[1] = 1000000 is not a token id"),
        (GenerateReq("r", [], {}), "the prompt is empty"),
        (GenerateReq("r", [1, 2], {}, True, 0, 6), "top_logprobs_num must be an int in [0, 5]"),
        (GenerateReq("r", [1, 2], {}, True, 0, 0, False, [10**6]), "token_ids_logprob[0]"),
        (
            GenerateReq("r", [1, 2], {"max_new_tokens": 100}, True, 0, 0, False, list(range(20))),
            "--max-logprob-entries is 1000",
        ),
        (GenerateReq("r", [1, 2], {}, True, 7), "logprob_start_len must be -1 or in [0, 1]"),
        (GenerateReq("r", [1], {"json_schema": "[" * 5000 + "]" * 5000}), "levels deep"),
        (GenerateReq("r", [1], {"regex": "(ab"}), "not a valid regular expression"),
        (GenerateReq("r", [1], {"temperature": "hot"}), "'temperature' must be"),
        (
            GenerateReq("r", [1], {}, bootstrap=Bootstrap("127.0.0.1", 1, 5)),
            "this server is not disaggregated",
        ),
    ],
)
def test_raw_messages_are_refused_with_an_abort_message(scheduler_and_outbox, msg, words):
    scheduler, front = scheduler_and_outbox
    out = run(scheduler, front, msg)["r"]
    assert out["finish"]["type"] == "abort" and words in out["finish"]["message"], out
    scheduler.check_kv()


def test_a_compile_past_the_timeout_ends_its_request(scheduler_and_outbox):
    from radixrt.protocol.sampling_params import SamplingParams
    from radixrt.scheduler.req import Req

    scheduler, front = scheduler_and_outbox
    stuck: Future = Future()
    stuck.started_at = time.monotonic() - 10  # running for 10 s, past the 5 s timeout
    params = SamplingParams(regex="a+")
    params.verify(320)
    scheduler.structured.compiling.append((Req("slow", [1], params), stuck))
    out = run(scheduler, front)["slow"]
    assert out["finish"]["type"] == "abort"
    assert "'regex' did not compile within 5 s" in out["finish"]["message"]


def test_a_message_that_does_not_decode_is_dropped(scheduler_and_outbox):
    scheduler, front = scheduler_and_outbox
    scheduler._receive(b"\x00not msgpack")
    scheduler._receive(msgspec.msgpack.encode({"type": "generate", "rid": 5}))
    scheduler._receive(encode(req("ok", [1, 2])))
    assert run(scheduler, front)["ok"]["finish"]["type"] == "length"
