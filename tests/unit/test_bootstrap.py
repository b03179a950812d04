"""SGLang's bootstrap fields (prefill/decode disaggregation) become one Bootstrap per scheduler
message by SGLang's rule (GenerateReqInput._normalize_bootstrap_params: a scalar room counts
up over prompts x n in SGLang's sample-major order, a list repeats per sample), and every bad
value is a ParamError naming its field. No model: build_requests on a stand-in engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radixrt.errors import ParamError
from radixrt.frontend.validation import build_requests
from radixrt.protocol.messages import Bootstrap
from radixrt.protocol.request_input import make_request
from radixrt.protocol.request_limits import validate_bootstrap
from radixrt.server_args import ServerArgs

HOST, OTHER_HOST, PORT = "10.0.0.7", "10.0.0.8", 38998
ROOM_MAX = (1 << 63) - 1


def engine(mode: str = "decode") -> SimpleNamespace:
    info = SimpleNamespace(vocab_size=100, context_length=512, pool_tokens=512)
    args = ServerArgs(
        disaggregation_mode=mode,
        disaggregation_bootstrap_port=7000,
        disaggregation_bootstrap_peers=f"{HOST},{OTHER_HOST}",
        disaggregation_bootstrap_key="k",
    )
    return SimpleNamespace(tokenizer=None, info=info, server_args=args)


def plan(mode: str = "decode", **fields) -> list[tuple[str, Bootstrap | None]]:
    """(rid, bootstrap) of each message, in the order the engine sends them."""
    fields.setdefault("input_ids", [1, 2, 3])
    planned, _ = build_requests(engine(mode), make_request(**fields))
    return [(p.msg.rid, p.msg.bootstrap) for p in planned]


def rooms(**fields) -> list[int]:
    return [b.room for _, b in plan(**fields) if b is not None]


def test_a_scalar_room_counts_up_in_sglangs_sample_major_order():
    # Two prompts, n=2: SGLang's requests are [p0 s0, p1 s0, p0 s1, p1 s1] with rooms
    # room+0..room+3; radixrt sends p0 s0, p0 s1, p1 s0, p1 s1 (rids a_0-0, a_0-1, a_1-0, ...).
    got = plan(
        input_ids=[[1, 2], [3]],
        sampling_params={"n": 2},
        rid="a",
        bootstrap_host=HOST,
        bootstrap_port=PORT,
        bootstrap_room=100,
    )
    assert got == [
        ("a_0-0", Bootstrap(HOST, PORT, 100)),
        ("a_0-1", Bootstrap(HOST, PORT, 102)),
        ("a_1-0", Bootstrap(HOST, PORT, 101)),
        ("a_1-1", Bootstrap(HOST, PORT, 103)),
    ]
    # One prompt, n=3 (what SMG sends for /generate with sampling_params.n: scalars).
    assert rooms(sampling_params={"n": 3}, bootstrap_host=HOST, bootstrap_room=5) == [5, 6, 7]
    assert rooms(bootstrap_host=HOST, bootstrap_room=0) == [0]


def test_lists_one_per_prompt_or_one_per_request():
    # A batch, n=1: one entry per prompt (SMG's /generate with input_ids [[...], [...]]).
    got = plan(
        input_ids=[[1], [2]],
        bootstrap_host=[HOST, OTHER_HOST],
        bootstrap_port=[PORT, PORT + 1],
        bootstrap_room=[9, 4],
    )
    assert [b for _, b in got] == [Bootstrap(HOST, PORT, 9), Bootstrap(OTHER_HOST, PORT + 1, 4)]
    # Chat with n=2 on one prompt: SMG sends lists of length n, one room per choice.
    got = plan(
        sampling_params={"n": 2},
        rid="c",
        bootstrap_host=[HOST, HOST],
        bootstrap_port=[PORT, PORT],
        bootstrap_room=[11, 3],
    )
    assert got == [("c-0", Bootstrap(HOST, PORT, 11)), ("c-1", Bootstrap(HOST, PORT, 3))]
    # Two prompts x n=2, one room per request: entry j * prompts + i (SGLang's order).
    four = rooms(
        input_ids=[[1], [2]],
        sampling_params={"n": 2},
        bootstrap_host=HOST,
        bootstrap_room=[10, 20, 30, 40],
    )
    assert four == [10, 30, 20, 40]


def test_a_null_port_is_the_servers_own_bootstrap_port():
    got = plan(bootstrap_host=HOST, bootstrap_port=None, bootstrap_room=1)
    assert got[0][1] == Bootstrap(HOST, 7000, 1)
    got = plan(
        input_ids=[[1], [2]], bootstrap_host=HOST, bootstrap_port=[None, 5], bootstrap_room=[1, 2]
    )
    assert [b.port for _, b in got if b is not None] == [7000, 5]


def test_without_bootstrap_fields_a_pd_server_serves_a_plain_request():
    for mode in ("prefill", "decode", "null"):
        got = plan(mode, sampling_params={"n": 2})
        assert len(got) == 2 and all(b is None for _, b in got)
    assert plan("prefill", bootstrap_port=None, bootstrap_room=None)[0][1] is None


def refusal(mode: str = "decode", **fields) -> ParamError:
    fields.setdefault("input_ids", [1, 2, 3])
    with pytest.raises(ParamError) as err:
        build_requests(engine(mode), make_request(**fields))
    return err.value


@pytest.mark.parametrize(
    "fields,param,words",
    [
        (dict(bootstrap_room=1, bootstrap_host=HOST), "bootstrap_host", "--disaggregation-mode"),
        (dict(bootstrap_port=PORT), "bootstrap_port", "not disaggregated"),
    ],
)
def test_a_server_that_is_not_disaggregated_refuses_bootstrap_fields(fields, param, words):
    err = refusal("null", **fields)
    assert err.param == param and words in str(err), str(err)


BAD = [
    (dict(bootstrap_room=1), "bootstrap_host", "bootstrap_host is required"),
    (dict(bootstrap_host=HOST), "bootstrap_room", "bootstrap_room is required"),
    (dict(bootstrap_host="", bootstrap_room=1), "bootstrap_host", "non-empty string"),
    (dict(bootstrap_host=HOST, bootstrap_room=-1), "bootstrap_room", "0..9223372036854775807"),
    (dict(bootstrap_host=HOST, bootstrap_room=ROOM_MAX + 1), "bootstrap_room", "got 92233"),
    (dict(bootstrap_host=HOST, bootstrap_room=1, bootstrap_port=0), "bootstrap_port", "1..65535"),
    (
        dict(bootstrap_host=HOST, bootstrap_room=1, bootstrap_port=65536),
        "bootstrap_port",
        "or null",
    ),
    (
        dict(input_ids=[[1], [2]], bootstrap_host=HOST, bootstrap_room=[1, 2, 3]),
        "bootstrap_room",
        "3 entries for 2 prompt(s) with n=1",
    ),
    (
        dict(input_ids=[[1], [2]], bootstrap_host=[HOST, "", HOST], bootstrap_room=1),
        "bootstrap_host",
        "3 entries",
    ),
    (
        dict(input_ids=[[1], [2]], bootstrap_host=[HOST, ""], bootstrap_room=1),
        "bootstrap_host",
        "bootstrap_host[1] must be a non-empty string",
    ),
    (
        dict(input_ids=[[1], [2]], bootstrap_host=HOST, bootstrap_room=[5, 5]),
        "bootstrap_room",
        "only 1 distinct room",
    ),
    (  # a list of one room per prompt, repeated for n samples: one room for both samples
        dict(sampling_params={"n": 2}, bootstrap_host=HOST, bootstrap_room=[5]),
        "bootstrap_room",
        "2 requests (prompts x n) of this body only 1 distinct room",
    ),
    (
        dict(sampling_params={"n": 2}, bootstrap_host=HOST, bootstrap_room=ROOM_MAX),
        "bootstrap_room",
        "past 2**63-1",
    ),
    (
        dict(
            input_ids=[[1], [2]],
            sampling_params=[{"n": 2}, {"n": 1}],
            bootstrap_host=HOST,
            bootstrap_room=1,
        ),
        "n",
        "the same n",
    ),
    (
        dict(sampling_params={"beam_width": 2, "n": 2}, bootstrap_host=HOST, bootstrap_room=1),
        "beam_width",
        "beam search (beam_width 2) does not run on a disaggregated server",
    ),
]


@pytest.mark.parametrize("fields,param,words", BAD)
def test_each_bad_bootstrap_is_a_param_error_naming_its_field(fields, param, words):
    err = refusal(**fields)
    assert err.param == param and words in str(err), str(err)


def test_the_scheduler_side_check_takes_one_bootstrap():
    validate_bootstrap(HOST, PORT, ROOM_MAX, "decode")
    for host, port, room, mode, param in [
        (None, PORT, 1, "prefill", "bootstrap_host"),
        (HOST, True, 1, "decode", "bootstrap_port"),
        (HOST, PORT, 1.0, "decode", "bootstrap_room"),
        (HOST, PORT, 1, "null", "bootstrap_room"),
    ]:
        with pytest.raises(ParamError) as err:
            validate_bootstrap(host, port, room, mode)
        assert err.value.param == param
