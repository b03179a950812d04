"""What a stranger can do to a prefill/decode pair (docs/disaggregation.md, "Trust model"), with
real engines (in process, tiny float32 model, KV checks on) and real ZeroMQ sockets:

- a request naming a prefill server the decode engine was not given is refused, naming
  bootstrap_host, before any socket opens; a thousand such requests leave no socket behind;
- pages from a peer that does not hold the bootstrap key are dropped: nothing of them enters
  the pool or the radix cache, and the request is recomputed or failed by the policy; two
  servers with different keys never exchange a page;
- a frame over the bootstrap port's limit costs its sender the connection, and the pair
  keeps serving, output exact.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import pytest
import torch
import zmq
from launch_helpers import free_port
from zmq.utils.monitor import recv_monitor_message

import radixrt
from radixrt.disaggregation.messages import KVPages, decode_to_prefill, encode, sign
from radixrt.errors import ParamError

COMMON = dict(dtype="float32", enable_kv_checks=True, skip_tokenizer_init=True, in_process=True)
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
PROMPT = [7, 19, 3, 88, 41, 5, 120, 9, 64, 2, 33, 17]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def want(model_dir):
    engine = radixrt.Engine(model_dir, **COMMON)
    try:
        return engine.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
    finally:
        engine.shutdown()


def _boot(port: int, room: int) -> dict:
    return dict(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=room)


def _both(prefill, decode, port: int, room: int) -> tuple[dict, dict]:
    """One request sent to both engines at once, as SMG sends it."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        p, d = (
            pool.submit(e.generate, input_ids=PROMPT, sampling_params=GREEDY, **_boot(port, room))
            for e in (prefill, decode)
        )
        return p.result(timeout=120), d.result(timeout=120)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_peers_not_configured_are_refused_before_any_socket_opens(model_dir, want):
    """A decode engine allowed loopback only: a thousand requests, each naming another
    host, are each refused by name, and the process holds no more descriptors than before."""
    decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **COMMON)
    try:
        assert decode.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"] == want
        before = _open_fds()
        hosts = [f"10.{i // 250}.{i % 250}.1" for i in range(500)]
        hosts += [f"prefill-{i}.bogus.invalid" for i in range(500)]
        for room, host in enumerate(hosts):
            with pytest.raises(ParamError, match="bootstrap_host") as refused:
                decode.generate(input_ids=PROMPT, sampling_params=GREEDY, bootstrap_host=host,
                                bootstrap_port=8998, bootstrap_room=room)  # fmt: skip
            assert refused.value.param == "bootstrap_host"
        assert "127.0.0.1 (any port)" in str(refused.value)
        assert _open_fds() == before
        stats = decode.get_stats(check_kv=True)
        assert stats["disagg_queue"] == stats["disagg_transfer_failures"] == 0
        assert decode.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"] == want
    finally:
        decode.shutdown()


class Impostor:
    """A stranger on a prefill server's port: it answers every pull with pages of the right
    sizes (every byte 0x7f: float32 3.4e38) signed with a key of its own."""

    def __init__(self, port: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.answered = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if self.sock.poll(20):
                identity, _, data = self.sock.recv_multipart()
                self._answer(identity, decode_to_prefill(data))

    def _answer(self, identity: bytes, pull) -> None:
        count = pull.prompt_len - pull.skip
        layout = pull.layout
        size = torch.empty((), dtype=getattr(torch, layout.dtype)).element_size()
        frame = b"\x7f" * (count * layout.kv_heads * layout.head_dim * size)
        header = encode(KVPages(pull.room, True, count=count, first_token=1))
        frames = [frame] * (2 * layout.layers)
        self.sock.send_multipart([identity, sign(b"not-the-key", header), header, *frames])
        self.answered += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close(0)
        self.ctx.term()


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_pages_without_the_key_never_enter_the_cache(model_dir, want, policy):
    port = free_port()
    impostor = Impostor(port)
    decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **COMMON,
                            disaggregation_bootstrap_key="the-key",
                            disaggregation_failure_policy=policy)  # fmt: skip
    try:
        got = decode.generate(input_ids=PROMPT, sampling_params=GREEDY, **_boot(port, 3))
        assert impostor.answered == 1
        stats = decode.get_stats(check_kv=True)
        assert stats["disagg_transfers"] == 0 and stats["disagg_transfer_failures"] == 1
        if policy == "fail":
            reason = got["meta_info"]["finish_reason"]
            assert reason["type"] == "abort" and "bootstrap key" in reason["message"]
            assert stats["evictable_tokens"] == 0  # nothing entered the radix cache
        else:
            assert got["output_ids"] == want  # recomputed here
            # What the cache holds is this server's own: a full hit answers the same.
            again = decode.generate(input_ids=PROMPT, sampling_params=GREEDY)
            assert again["output_ids"] == want and again["meta_info"]["cached_tokens"] > 0
    finally:
        decode.shutdown()
        impostor.close()


def test_servers_with_different_keys_exchange_no_page(model_dir, want):
    port = free_port()
    args = dict(COMMON, disaggregation_bootstrap_port=port, disaggregation_transfer_timeout=1.0)
    prefill = radixrt.Engine(model_dir, disaggregation_mode="prefill", **args,
                             disaggregation_bootstrap_key="key-a")  # fmt: skip
    decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **args,
                            disaggregation_bootstrap_key="key-b")  # fmt: skip
    try:
        p, d = _both(prefill, decode, port, room=21)
        assert d["output_ids"] == want  # recomputed after the timeout
        reason = p["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "no decode server asked" in reason["message"]
        assert decode.get_stats(check_kv=True)["disagg_transfers"] == 0
        assert prefill.get_stats(check_kv=True)["disagg_transfers"] == 0
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_an_oversized_frame_is_dropped_and_the_pair_keeps_serving(model_dir, want):
    port = free_port()
    args = dict(COMMON, disaggregation_bootstrap_port=port, disaggregation_bootstrap_key="k")
    prefill = radixrt.Engine(model_dir, disaggregation_mode="prefill", **args)
    decode = radixrt.Engine(model_dir, disaggregation_mode="decode", **args)
    ctx = zmq.Context()
    flooder = ctx.socket(zmq.DEALER)
    flooder.setsockopt(zmq.LINGER, 0)
    events = flooder.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        flooder.connect(f"tcp://127.0.0.1:{port}")
        flooder.send_multipart([b"", b"\x00" * (8 << 20)])  # 8 MiB where a pull is ~100 bytes
        deadline = time.monotonic() + 10
        seen = []
        while zmq.EVENT_DISCONNECTED not in seen and time.monotonic() < deadline:
            if events.poll(100):
                seen.append(recv_monitor_message(events)["event"])
        assert zmq.EVENT_DISCONNECTED in seen, "the prefill server read the whole frame"
        _, d = _both(prefill, decode, port, room=5)
        assert d["output_ids"] == want
        assert decode.get_stats(check_kv=True)["disagg_transfers"] == 1
    finally:
        events.close(0)
        flooder.close(0)
        ctx.term()
        prefill.shutdown()
        decode.shutdown()
