"""IncrementalDetokenizer against a full decode: same text whatever the chunking, no split
UTF-8 character, stop strings never shown (not even their start); and the detokenizer that runs
between the scheduler and the frontend, as a process or (in-process engines) a thread."""

from __future__ import annotations

import random
import threading

import pytest
from transformers import AutoTokenizer

from radixrt.detokenizer.detokenizer import Detokenizer, IncrementalDetokenizer, failure, serve
from radixrt.ipc.transport import queue_pipeline
from radixrt.protocol.messages import (
    BatchOutput,
    ControlReply,
    DetokParams,
    ReqOutput,
    SchedulerFailed,
    decode_from_scheduler,
    encode,
)

TEXTS = [
    "Hello world, this is a test of streaming.",
    "Emoji 🙂🚀 and accents: déjà vu, naïve café; 中文字符 와 한국어.",
    "  leading spaces\nnew lines\n\n\ttabs and  double  spaces  ",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    # One token per byte: every multi-byte character is split across tokens.
    return AutoTokenizer.from_pretrained(tiny_model_dir("llama"))


def stream(
    detok: IncrementalDetokenizer, ids: list[int], rng: random.Random, finish_reason=None
) -> list[str]:
    out, i = [], 0
    while True:
        n = rng.randint(1, 3)
        if i + n >= len(ids):
            out.append(detok.finish(ids[i:], finish_reason))
            return out
        out.append(detok.add(ids[i : i + n]))
        i += n


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_to_the_full_decode_and_never_split_a_character(tokenizer, text, seed):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(IncrementalDetokenizer(tokenizer), ids, random.Random(seed))
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("seed", range(5))
def test_a_stop_string_is_never_shown_even_in_part(tokenizer, seed):
    text = "alpha beta STOP gamma"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop=["STOP"])
    shown = ""
    for d in stream(detok, ids, random.Random(seed), {"type": "stop", "matched": "STOP"}):
        shown += d
        assert "S" not in shown.replace("alpha beta ", "", 1)
    assert shown == "alpha beta "


def test_no_stop_trim_keeps_the_stop_string(tokenizer):
    ids = tokenizer.encode("one two END three", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop=["END"], no_stop_trim=True)
    shown = "".join(stream(detok, ids, random.Random(0), {"type": "stop", "matched": "END"}))
    assert shown == "one two END"


def test_a_matched_stop_token_is_trimmed(tokenizer):
    ids = tokenizer.encode("abc;", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    shown = "".join(stream(detok, ids, random.Random(0), {"type": "stop", "matched": ids[-1]}))
    assert shown == "abc"


def test_a_stop_regex_that_backtracks_forever_is_given_up_not_searched_for_ever(tokenizer):
    import time

    detok = IncrementalDetokenizer(tokenizer, stop_regex=["(a|aa)+b", "zz"])
    start = time.monotonic()
    out = "".join(detok.add(tokenizer.encode("a", add_special_tokens=False)) for _ in range(40))
    out += detok.finish(tokenizer.encode("czz!", add_special_tokens=False), None)
    assert time.monotonic() - start < 5  # each search stops at its time limit, then no more
    assert out == "a" * 40 + "c"  # the other stop regex still applies
    assert [rx.pattern for rx in detok.stop_regex] == ["zz"]


# -- the detokenizer between the scheduler and the frontend (a process, or a thread) ----------
def _outputs(rid: str, chunks: list[list[int]]) -> list[bytes]:
    last = len(chunks) - 1
    return [
        encode(
            BatchOutput(
                [
                    ReqOutput(
                        rid,
                        ids,
                        i == last,
                        {"type": "length"} if i == last else None,
                        1,
                        1,
                        0,
                        detok=DetokParams(stop=["STOP"]) if i == 0 else None,
                    )
                ]
            )
        )
        for i, ids in enumerate(chunks)
    ]


def _serve_in_thread(detok: Detokenizer):
    ends = queue_pipeline()
    done = threading.Event()
    thread = threading.Thread(target=serve, args=(ends.detokenizer, detok, done.is_set))
    thread.start()
    return ends, done, thread


def test_serve_fills_the_text_in_order_and_drains_before_it_stops(tokenizer):
    ids = tokenizer.encode("ab cd STOP ef", add_special_tokens=False)
    ends, done, thread = _serve_in_thread(Detokenizer(tokenizer))
    for data in _outputs("r", [ids[:2], ids[2:7], ids[7:]]):
        ends.scheduler.send(data)
    ends.scheduler.send(encode(ControlReply("flush_cache", True)))
    done.set()  # asked only once nothing is pending: everything above still goes out
    thread.join(timeout=10)
    assert not thread.is_alive()
    got = [decode_from_scheduler(d) for d in ends.frontend.recv(timeout=1)]
    texts = [m.outputs[0].text for m in got[:3]]
    assert "".join(texts) == "ab cd " and texts[0] == "ab"
    assert got[3] == ControlReply("flush_cache", True)


def test_without_a_tokenizer_messages_pass_unchanged():
    data = _outputs("r", [[1, 2], [3]])
    assert [Detokenizer(None).process(d) for d in data] == data


def test_a_failure_names_the_detokenizer():
    msg = decode_from_scheduler(failure(UnicodeError("bad bytes")))
    assert isinstance(msg, SchedulerFailed)
    assert msg.error == "the detokenizer failed: bad bytes" and msg.error_type == "UnicodeError"


def test_in_process_engine_gets_its_text_from_the_detokenizer_thread(tiny_model_dir, monkeypatch):
    import radixrt
    from radixrt.errors import SchedulerDied

    with radixrt.Engine(
        tiny_model_dir("llama"),
        in_process=True,
        dtype="float32",
        max_total_tokens=512,
        log_level="warning",
    ) as engine:
        names = {t.name for t in threading.enumerate()}
        assert {"radixrt-scheduler", "radixrt-detokenizer"} <= names
        params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
        out = engine.generate(input_ids=[5, 6, 7], sampling_params=params)
        assert out["text"] == engine.tokenizer.decode(out["output_ids"])
        streamed = "".join(
            c["text"]
            for c in engine.generate(input_ids=[5, 6, 7], sampling_params=params, stream=True)
        )
        assert streamed == out["text"]

        class Broken:
            def push(self, new_ids):
                raise UnicodeError("cannot decode")

        # The detokenizer thread picks each request's decoder through this name.
        monkeypatch.setattr("radixrt.detokenizer.detokenizer.new_decoder", lambda *args: Broken())
        with pytest.raises(SchedulerDied, match="the detokenizer failed: cannot decode"):
            engine.generate(input_ids=[5, 6, 7], sampling_params=params)
        with pytest.raises(SchedulerDied, match="detokenizer"):
            engine.generate(input_ids=[5], sampling_params=params)
