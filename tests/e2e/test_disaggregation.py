"""Prefill/decode disaggregation between two engines of one process (each its own scheduler,
KV pool and radix cache; pages over loopback TCP): the decode engine's greedy output equals a
single engine's token for token in float32, with pages of 1 and 16, chunked prefill on the
prefill side, radix hits on either side, logprobs, n > 1 and streams; the decode side asks
only for what its own cache lacks; a transfer that fails or times out is recomputed or fails
the request as the policy says; an abort on either side frees both sides' pages. The KV
checks run on both engines after every step."""

from __future__ import annotations

import concurrent.futures
import random
import time

import pytest

import radixrt

TINY_VOCAB = 320
COMMON = dict(dtype="float32", enable_kv_checks=True, skip_tokenizer_init=True, in_process=True)
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def _prompts(count: int, seed: int = 0, low: int = 3, high: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(TINY_VOCAB - 64) for _ in range(rng.randint(low, high))]
        for _ in range(count)
    ]


def _port() -> int:
    from launch_helpers import free_port

    return free_port()


def _call(engine, **kwargs):
    result = engine.generate(**kwargs)
    return list(result) if kwargs.get("stream") else result


class Pair:
    """A prefill engine and a decode engine that know each other by the prefill's port."""

    def __init__(self, model: str, prefill: dict, decode: dict) -> None:
        self.port = _port()
        args = dict(COMMON, disaggregation_bootstrap_port=self.port)
        self.prefill = radixrt.Engine(model, disaggregation_mode="prefill", **args, **prefill)
        self.decode = radixrt.Engine(model, disaggregation_mode="decode", **args, **decode)
        self.rooms = iter(range(random.Random(1).randrange(1 << 40), 1 << 62, 1000))

    def generate(self, input_ids, params, room=None, **fields):
        """Both sides at once, as SMG sends them: (prefill's result, decode's result); a
        stream's result is the list of its chunks."""
        boot = dict(bootstrap_host="127.0.0.1", bootstrap_port=self.port)
        boot["bootstrap_room"] = next(self.rooms) if room is None else room
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            p, d = (
                pool.submit(_call, engine, input_ids=input_ids, sampling_params=params,
                            **boot, **fields)
                for engine in (self.prefill, self.decode)
            )  # fmt: skip
            return p.result(timeout=120), d.result(timeout=120)

    def check_idle(self) -> None:
        """Both pools hold only cached pages: nothing is held by a request or a room."""
        for engine in (self.prefill, self.decode):
            stats = engine.get_stats(check_kv=True)
            assert stats["running"] == stats["queued"] == stats["disagg_queue"] == 0, stats
            assert stats["free_tokens"] + stats["evictable_tokens"] == stats["pool_tokens"]

    def close(self) -> None:
        self.prefill.shutdown()
        self.decode.shutdown()


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def reference(model_dir):
    engine = radixrt.Engine(model_dir, **COMMON)
    yield engine
    engine.shutdown()


def _ids(results):
    return [r["output_ids"] for r in results]


@pytest.mark.parametrize(
    "settings",
    [
        {"page_size": 1},
        {"page_size": 16},
        {"page_size": 16, "chunked_prefill_size": 16},
        {"page_size": 4, "disable_radix_cache": True},
    ],
    ids=["page1", "page16", "page16-chunked", "no-radix"],
)
def test_decode_output_equals_one_engine(model_dir, reference, settings):
    pair = Pair(
        model_dir, settings, {k: v for k, v in settings.items() if k != "chunked_prefill_size"}
    )
    try:
        prompts = _prompts(6)
        want = _ids(reference.generate(input_ids=prompts, sampling_params=GREEDY))
        prefill, decode = pair.generate(prompts, GREEDY)
        assert _ids(decode) == want
        # The prefill server answers with the first token once its pages are sent.
        assert [r["output_ids"] for r in prefill] == [w[:1] for w in want]
        assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in prefill)
        again_p, again_d = pair.generate(prompts[:2], GREEDY)  # radix hits on both sides
        assert _ids(again_d) == want[:2]
        stats = pair.decode.get_stats()
        assert stats["disagg_transfers"] == 8 and stats["disagg_transfer_failures"] == 0
        if not settings.get("disable_radix_cache"):
            assert stats["disagg_reused_tokens"] > 0  # asked only for what it lacked
        pair.check_idle()
    finally:
        pair.close()


def test_decode_asks_only_for_what_its_cache_lacks(model_dir, reference):
    pair = Pair(model_dir, {"page_size": 4}, {"page_size": 4})
    try:
        shared = _prompts(1, seed=3, low=40, high=40)[0]
        first, second = shared + [5, 6, 7], shared + [9, 10]
        pair.generate([first], GREEDY)
        sent = pair.decode.get_stats()["disagg_transfer_tokens"]
        assert sent == len(first)
        _, decode = pair.generate([second], GREEDY)
        assert _ids(decode) == _ids(reference.generate(input_ids=[second], sampling_params=GREEDY))
        stats = pair.decode.get_stats()
        assert stats["disagg_transfer_tokens"] - sent == len(second) - 40  # 10 pages held
        assert stats["disagg_reused_tokens"] == 40
        pair.check_idle()
    finally:
        pair.close()


def test_logprobs_n_and_streams(model_dir, reference):
    pair = Pair(model_dir, {"page_size": 16}, {"page_size": 16})
    try:
        prompt = _prompts(1, seed=4)[0]
        fields = dict(return_logprob=True, logprob_start_len=0, top_logprobs_num=3)
        want = reference.generate(input_ids=prompt, sampling_params=GREEDY, **fields)
        prefill, decode = pair.generate(prompt, GREEDY, **fields)
        meta, want_meta = decode["meta_info"], want["meta_info"]
        assert decode["output_ids"] == want["output_ids"]
        assert meta["input_token_logprobs"] == []  # the prefill server's, as SMG merges them
        # The first token's entries come from the prefill server: float32 makes them equal.
        assert meta["output_token_logprobs"] == want_meta["output_token_logprobs"]
        assert meta["output_top_logprobs"] == want_meta["output_top_logprobs"]
        prompt_lp = prefill["meta_info"]["input_token_logprobs"]
        assert [t for _, t, *_ in prompt_lp] == prompt
        sent = pair.decode.get_stats()["disagg_transfer_tokens"]
        n_prompt = _prompts(1, seed=21, low=40, high=40)[0]
        n_want = reference.generate(input_ids=n_prompt, sampling_params=GREEDY)["output_ids"]
        _, decode_n = pair.generate(n_prompt, dict(GREEDY, n=3))
        assert [r["output_ids"] for r in decode_n] == [n_want] * 3
        # The prompt went once; the other two took its 32 whole pages from the cache.
        assert pair.decode.get_stats()["disagg_transfer_tokens"] - sent == 40 + 2 * 8
        _, chunks = pair.generate(prompt, GREEDY, stream=True)
        assert len(chunks) > 1  # the decode side streams token by token
        assert [i for c in chunks for i in c["output_ids"]] == want["output_ids"]
        pair.check_idle()
    finally:
        pair.close()


def test_a_prefill_queue_longer_than_the_timeout_is_not_a_failure(model_dir, reference):
    """The prefill server says it is on the room while it waits behind other work there."""
    port = _port()
    args = dict(COMMON, disaggregation_bootstrap_port=port, disaggregation_transfer_timeout=0.2)
    prefill = radixrt.Engine(
        model_dir, disaggregation_mode="prefill", max_running_requests=1, **args
    )
    decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **args)
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            start = time.monotonic()
            busy = pool.submit(prefill.generate, input_ids=[9] * 8,
                               sampling_params=dict(GREEDY, max_new_tokens=480))  # fmt: skip
            time.sleep(0.1)
            boot = dict(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=3)
            prompt = _prompts(1, seed=12)[0]
            p, d = (pool.submit(e.generate, input_ids=prompt, sampling_params=GREEDY, **boot)
                    for e in (prefill, decode))  # fmt: skip
            assert busy.result(timeout=120)["meta_info"]["completion_tokens"] == 480
            assert time.monotonic() - start > 3 * 0.2  # the room waited past the timeout
            got, _ = d.result(timeout=120), p.result(timeout=120)
        want = reference.generate(input_ids=prompt, sampling_params=GREEDY)["output_ids"]
        assert got["output_ids"] == want
        assert decode.get_stats()["disagg_transfer_failures"] == 0
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_a_prefill_server_that_never_answers_is_recomputed(model_dir, reference):
    """No prefill server on the port: the decode engine recomputes after the timeout."""
    port = _port()
    decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **COMMON,
                            disaggregation_transfer_timeout=1.0)  # fmt: skip
    try:
        prompts = _prompts(3, seed=7)
        want = _ids(reference.generate(input_ids=prompts, sampling_params=GREEDY))
        start = time.monotonic()
        got = decode.generate(input_ids=prompts, sampling_params=GREEDY, bootstrap_host="127.0.0.1",
                              bootstrap_port=port, bootstrap_room=11)  # fmt: skip
        assert _ids(got) == want
        assert time.monotonic() - start < 30
        stats = decode.get_stats(check_kv=True)
        assert stats["disagg_transfer_failures"] == 3 and stats["running"] == 0
    finally:
        decode.shutdown()


def test_the_fail_policy_ends_the_request(model_dir):
    port = _port()
    decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **COMMON,
                            disaggregation_transfer_timeout=0.5,
                            disaggregation_failure_policy="fail")  # fmt: skip
    try:
        got = decode.generate(input_ids=[1, 2, 3], sampling_params=GREEDY,
                              bootstrap_host="127.0.0.1", bootstrap_port=port,
                              bootstrap_room=5)  # fmt: skip
        reason = got["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "room 5" in reason["message"]
        stats = decode.get_stats(check_kv=True)
        assert stats["free_tokens"] + stats["evictable_tokens"] == stats["pool_tokens"]
    finally:
        decode.shutdown()


def test_a_room_no_decode_server_asks_for_frees_the_prefill_pages(model_dir):
    prefill = radixrt.Engine(model_dir, disaggregation_mode="prefill", **COMMON,
                             disaggregation_bootstrap_port=_port(),
                             disaggregation_transfer_timeout=0.5)  # fmt: skip
    try:
        got = prefill.generate(input_ids=_prompts(2, seed=9), sampling_params=GREEDY,
                               bootstrap_host="127.0.0.1", bootstrap_room=77)  # fmt: skip
        for r in got:
            reason = r["meta_info"]["finish_reason"]
            assert reason["type"] == "abort" and "no decode server asked" in reason["message"]
        stats = prefill.get_stats(check_kv=True)
        assert stats["disagg_queue"] == 0 and stats["disagg_transfer_failures"] == 2
        assert stats["free_tokens"] + stats["evictable_tokens"] == stats["pool_tokens"]
        # Without a room it is an ordinary request: health checks need no peer.
        plain = prefill.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)
        assert len(plain["output_ids"]) == GREEDY["max_new_tokens"]
    finally:
        prefill.shutdown()


def test_an_abort_on_the_decode_side_frees_both(model_dir):
    pair = Pair(model_dir, {"page_size": 4}, {"page_size": 4})
    try:
        params = dict(GREEDY, max_new_tokens=400)
        room = 4242
        boot = dict(bootstrap_host="127.0.0.1", bootstrap_port=pair.port, bootstrap_room=room)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            d = pool.submit(pair.decode.generate, input_ids=[3, 4, 5], sampling_params=params,
                            rid="victim", **boot)  # fmt: skip
            p = pool.submit(pair.prefill.generate, input_ids=[3, 4, 5], sampling_params=params,
                            **boot)  # fmt: skip
            p.result(timeout=60)
            time.sleep(0.2)
            pair.decode.abort_request("victim")
            out = d.result(timeout=60)
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        pair.check_idle()
    finally:
        pair.close()


def test_an_abort_on_the_prefill_side_frees_it_and_refuses_a_late_pull(model_dir, reference):
    """A held prompt whose client gave up is freed at once; a decode server that asks for the
    room afterwards is refused and recomputes (output exact)."""
    port = _port()
    args = dict(COMMON, disaggregation_bootstrap_port=port, disaggregation_transfer_timeout=30)
    prefill = radixrt.Engine(model_dir, disaggregation_mode="prefill", **args)
    boot = dict(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=8)
    prompt = _prompts(1, seed=14)[0]
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(prefill.generate, input_ids=prompt, sampling_params=GREEDY,
                               rid="gone", **boot)  # fmt: skip
            deadline = time.monotonic() + 30
            while prefill.get_stats()["disagg_queue"] == 0:  # its prefill is done, it waits
                assert time.monotonic() < deadline
                time.sleep(0.02)
            prefill.abort_request("gone")
            assert held.result(timeout=30)["meta_info"]["finish_reason"]["type"] == "abort"
        stats = prefill.get_stats(check_kv=True)
        assert stats["disagg_queue"] == 0
        assert stats["free_tokens"] + stats["evictable_tokens"] == stats["pool_tokens"]
        decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **args)
        try:
            got = decode.generate(input_ids=prompt, sampling_params=GREEDY, **boot)
            want = reference.generate(input_ids=prompt, sampling_params=GREEDY)
            assert got["output_ids"] == want["output_ids"]
            assert decode.get_stats(check_kv=True)["disagg_transfer_failures"] == 1
        finally:
            decode.shutdown()
    finally:
        prefill.shutdown()


def test_a_constrained_request_through_the_pair_equals_one_engine(model_dir):
    """The prefill server samples the first token under the grammar; the decode server's
    matcher takes it, then constrains the rest."""
    args = dict(COMMON, skip_tokenizer_init=False)
    reference = radixrt.Engine(model_dir, **args)
    port = _port()
    pd = dict(args, disaggregation_bootstrap_port=port)
    prefill = radixrt.Engine(model_dir, disaggregation_mode="prefill", **pd)
    decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **pd)
    try:
        params = {"temperature": 0, "max_new_tokens": 24, "regex": r"(yes|no), [a-z]{3,8}\."}
        want = reference.generate("Answer: ", params)
        boot = dict(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=31)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            p, d = (pool.submit(e.generate, "Answer: ", params, **boot) for e in (prefill, decode))
            got, _ = d.result(timeout=120), p.result(timeout=120)
        assert got["text"] == want["text"] and got["output_ids"] == want["output_ids"]
        assert decode.get_stats(check_kv=True)["disagg_transfers"] == 1
    finally:
        for engine in (reference, prefill, decode):
            engine.shutdown()


def test_speculative_decoding_on_the_decode_side(model_dir, reference):
    """NGRAM drafts start from the transferred first token; the output stays exact."""
    pair = Pair(model_dir, {}, {"speculative_algorithm": "NGRAM"})
    try:
        prompt = [5, 6, 7, 8] * 4
        params = dict(GREEDY, max_new_tokens=40)
        want = reference.generate(input_ids=prompt, sampling_params=params)["output_ids"]
        _, got = pair.generate(prompt, params)
        assert got["output_ids"] == want
        assert pair.decode.get_stats()["spec_draft_tokens"] > 0
        pair.check_idle()
    finally:
        pair.close()
