"""What one request may ask for, checked without a server: the logprob caps, the prompt and
batch limits of build_requests (before anything is tokenized), the frontend's constraint
check (unsatisfiable, over its time limit and then answered at once), the sampler's NO_TOKEN
for a row with nothing left to draw, a stop regex that backtracks forever, and the JSON depth
scan on hostile text."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from radixrt.errors import ParamError
from radixrt.executor.sampler import NO_TOKEN, SamplingBatch, sample
from radixrt.frontend.validation import build_requests
from radixrt.grammar.constraint import json_text_depth
from radixrt.protocol.request_input import make_request
from radixrt.protocol.request_limits import validate_logprobs
from radixrt.protocol.sampling_params import SamplingParams
from radixrt.server_args import ServerArgs

VOCAB = 49152


def limits(**kw):
    base = dict(
        top_logprobs_num=0,
        token_ids_logprob=None,
        logprob_start_len=-1,
        return_logprob=True,
        prompt_len=64,
        max_new_tokens=100,
        max_logprobs=20,
        max_entries=1_000_000,
    )
    return {**base, **kw}


def test_top_logprobs_num_is_capped_by_max_logprobs():
    validate_logprobs(**limits(top_logprobs_num=20))
    with pytest.raises(
        ParamError,
        match=r"top_logprobs_num must be an int in \[0, 20\] "
        r"\(the server's --max-logprobs\), got 49152",
    ) as err:
        validate_logprobs(**limits(top_logprobs_num=49152))
    assert err.value.param == "top_logprobs_num"
    with pytest.raises(ParamError, match="got True"):
        validate_logprobs(**limits(top_logprobs_num=True))


def test_logprob_entries_are_capped_and_name_the_biggest_factor():
    # (64 - 0 + 100) x (1 + 20) = 3,444 entries: fine.
    validate_logprobs(**limits(top_logprobs_num=20, logprob_start_len=0))
    with pytest.raises(ParamError, match="3280164 logprob entries") as err:
        validate_logprobs(**limits(token_ids_logprob=list(range(20000)), logprob_start_len=0))
    assert err.value.param == "token_ids_logprob"
    with pytest.raises(ParamError, match="--max-logprob-entries is 100") as err:
        validate_logprobs(**limits(top_logprobs_num=5, max_entries=100))
    assert err.value.param == "top_logprobs_num"
    # Without return_logprob nothing is produced, whatever the ids.
    validate_logprobs(**limits(return_logprob=False, token_ids_logprob=list(range(20000))))
    with pytest.raises(ParamError, match=r"logprob_start_len must be -1 or in \[0, 63\]"):
        validate_logprobs(**limits(logprob_start_len=64))


class NoTokenizer:
    def encode(self, text: str) -> list[int]:
        raise AssertionError("a prompt over the limits was tokenized")


def fake_engine(**args) -> SimpleNamespace:
    info = SimpleNamespace(vocab_size=VOCAB, context_length=8192, pool_tokens=8192)
    return SimpleNamespace(tokenizer=NoTokenizer(), info=info, server_args=ServerArgs(**args))


@pytest.mark.parametrize(
    "fields,param,words",
    [
        (
            dict(text="a" * 101),
            "text",
            "text has 101 characters; the server's --max-prompt-chars is 100",
        ),
        (dict(text=["ok", "a" * 101]), "text", "text[1] has 101 characters"),
        (dict(text=["a"] * 9), "text", "text holds 9 prompts; one request may make at most 8"),
        (dict(input_ids=[[1]] * 9), "input_ids", "input_ids holds 9 prompts"),
        (dict(text=["a"] * 3, sampling_params={"n": 3}), "n", "3 prompt(s) x n make 9 requests"),
        (dict(text=["a", "b"], sampling_params=[{"n": 4}, {"n": 5}]), "n", "make 9 requests"),
        (dict(input_ids=[[1], 2]), "input_ids", "not a mix"),
    ],
)
def test_prompts_and_batches_are_bounded_before_tokenizing(fields, param, words):
    engine = fake_engine(max_prompt_chars=100, max_request_batch_size=8)
    with pytest.raises(ParamError) as err:
        build_requests(engine, make_request(**fields))
    assert err.value.param == param and words in str(err.value), str(err.value)


def test_build_requests_checks_logprob_limits_and_token_ids():
    engine = fake_engine(max_logprobs=5)
    with pytest.raises(ParamError, match=r"\[0, 5\]"):
        build_requests(engine, make_request(input_ids=[1, 2], top_logprobs_num=6))
    with pytest.raises(ParamError, match=r"input_ids\[1\] = 49152 is not a token id"):
        build_requests(engine, make_request(input_ids=[1, VOCAB]))
    with pytest.raises(ParamError, match="got 49152") as err:
        build_requests(engine, make_request(input_ids=[1], token_ids_logprob=[3, VOCAB]))
    assert err.value.param == "token_ids_logprob"
    planned, _ = build_requests(
        engine, make_request(input_ids=[1, 2], top_logprobs_num=5, return_logprob=True)
    )
    assert planned[0].msg.top_logprobs_num == 5


@pytest.fixture(scope="module")
def tokenizer(default_tokenizer):
    return default_tokenizer


def test_the_checker_refuses_what_no_token_can_start(tokenizer):
    from radixrt.grammar.checker import ConstraintChecker

    checker = ConstraintChecker(tokenizer, VOCAB, timeout_s=30)
    try:
        checker.check("regex", "[0-9]+")
        checker.check("json_schema", '{"type": "object"}')
        checker.check("regex", "")  # may end at once: the stop token is allowed
        for kind, text in (("regex", "\u0016"), ("ebnf", 'root ::= "\\x16"')):
            with pytest.raises(ParamError, match="can never be satisfied") as err:
                checker.check(kind, text)
            assert err.value.param == kind
        with pytest.raises(ParamError, match="not a valid regular expression"):
            checker.check("regex", "(ab")
    finally:
        checker.close()


def test_a_compile_past_the_timeout_is_refused_and_then_answered_at_once(tokenizer):
    from radixrt.grammar.checker import ConstraintChecker

    checker = ConstraintChecker(tokenizer, VOCAB, timeout_s=0.05)
    slow = "[a-z0-9 ]{1,5000}x"  # compiles in ~0.65 s
    try:
        checker.check("regex", "[0-9]")  # the compiler's setup is not the request's time
        with pytest.raises(ParamError, match="did not compile within 0.05 s") as err:
            checker.check("regex", slow)
        assert err.value.param == "regex"
        start = time.monotonic()
        with pytest.raises(ParamError, match="did not compile within"):
            checker.check("regex", slow)
        assert time.monotonic() - start < 0.04  # the verdict, not a second compile
    finally:
        checker.close()


def test_a_row_with_nothing_left_to_draw_samples_no_token():
    logits = torch.randn(3, 10)
    logits[1] = float("-inf")
    logits[2, :] = float("-inf")
    logits[2, 7] = 0.0  # only the end of sequence (7) is allowed, and min_new_tokens bans it
    params = [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(min_new_tokens=3)]
    for p in params:
        p.verify(10)
    for temperature in (0.0, 1.0):
        for p in (params[0], params[2]):
            p.temperature = temperature
        batch = SamplingBatch.build(
            params, [None] * 3, [[], [], [1]], [[1]] * 3, 10, "cpu", eos_token_ids=[7]
        )
        ids = sample(logits, batch).tolist()
        assert ids[0] != NO_TOKEN and ids[1:] == [NO_TOKEN, NO_TOKEN], ids


def test_a_stop_regex_that_backtracks_forever_fails_its_request_quickly():
    from radixrt.errors import RequestFailed
    from radixrt.scheduler.req import Req
    from radixrt.scheduler.stops import matched_stop_regex

    class Chars:
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids)

    params = SamplingParams(stop_regex=["(a+)+$"])
    params.verify(VOCAB)
    req = Req("r", [1], params, output_ids=[ord("a")] * 5000 + [ord("c")])
    start = time.monotonic()
    with pytest.raises(RequestFailed, match="took over .*catastrophic backtracking"):
        matched_stop_regex(req, Chars())
    assert time.monotonic() - start < 2
    req.output_ids = [ord("a")] * 5
    assert matched_stop_regex(req, Chars()) == "(a+)+$"


def test_the_json_depth_scan_is_linear_on_hostile_text():
    assert json_text_depth('{"a": [1, {"b": "]]]}}}\\"[[["}]}') == 3
    start = time.monotonic()
    assert json_text_depth('"' + '\\"' * 100_000) == 0  # one unterminated string
    assert json_text_depth('["' + "[" * 50_000) == 1  # the rest is inside a string
    assert json_text_depth('["' * 50_000) == 25_000  # [ "[" [ "[" ...
    assert json_text_depth("[" * 100_000) == 100_000
    assert time.monotonic() - start < 2


def test_param_error_names_its_field_first_and_is_a_value_error():
    err = ParamError("max_new_tokens", "too many")
    assert isinstance(err, ValueError) and err.param == "max_new_tokens" and str(err) == "too many"


def test_shared_checks_name_the_field_they_are_given():
    from radixrt.protocol.request_limits import validate_prompt_len, validate_token_ids

    with pytest.raises(ParamError, match="the prompt is empty") as err:
        validate_prompt_len(0, 64, "text")
    assert err.value.param == "text"
    context = r"This model's maximum context length is 64 tokens \(context_length\)"
    with pytest.raises(ParamError, match=context) as err:
        validate_prompt_len(64, 64)
    assert err.value.param == "input_ids" and err.value.code == "context_length_exceeded"
    with pytest.raises(ParamError, match=r"prompt\[1\]\[2\] = -1 is not a token id") as err:
        validate_token_ids([0, 1, -1], 10, "prompt[1]", param="prompt")
    assert err.value.param == "prompt"


def test_openai_layer_takes_param_from_the_error_not_its_text():
    from radixrt.entrypoints.openai.translate import rename_engine_error

    names = {"max_new_tokens": "max_tokens", "input_ids": "prompt"}
    # The message names other fields first: only the exception's own param counts.
    api = rename_engine_error(
        ParamError("max_new_tokens", "'temperature' and max_new_tokens"), names
    )
    assert api.param == "max_tokens" and api.message == "'temperature' and max_tokens"
    assert rename_engine_error(ValueError("bad 'temperature'"), names).param is None
