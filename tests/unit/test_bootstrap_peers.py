"""Disaggregation peers are configured, not requested: --disaggregation-bootstrap-peers' syntax
(errors name the field), its default (loopback on any port), names resolved once when the list
is built and never for a request, a request naming anything else refused by name
(bootstrap_host, with the allowed values) in the frontend before a message is made; and the
bootstrap key the channel needs to leave the machine. No model, no socket."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radixrt.disaggregation.peers import BootstrapPeers
from radixrt.errors import ParamError
from radixrt.frontend.validation import build_requests
from radixrt.protocol.request_input import make_request
from radixrt.server_args import ServerArgs
from radixrt.server_args.bootstrap_peers import PeerRule, is_loopback, parse_bootstrap_peers


def test_the_list_takes_hosts_with_or_without_ports_and_names_the_field_when_bad():
    assert parse_bootstrap_peers("127.0.0.1, Prefill-A:8998,[::1]:7000,fe80::1") == (
        PeerRule("127.0.0.1", None),
        PeerRule("prefill-a", 8998),
        PeerRule("::1", 7000),
        PeerRule("fe80::1", None),
    )
    for bad in ("", "host:0", "host:99999", "host:x", ":8998", "[::1", "[::1]x", "a b"):
        with pytest.raises(ValueError, match="disaggregation_bootstrap_peers"):
            parse_bootstrap_peers(bad)
    with pytest.raises(ValueError, match="disaggregation_bootstrap_peers"):
        ServerArgs(disaggregation_bootstrap_peers="h:0")


def test_loopback_is_localhost_127_8_and_v6_one_not_every_interface():
    assert all(map(is_loopback, ["127.0.0.1", "127.5.0.1", "localhost", "::1", "[::1]"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "", "10.0.0.5", "prefill.internal"]))


def test_the_default_allows_loopback_on_any_port_and_refuses_everything_else():
    peers = BootstrapPeers(ServerArgs().disaggregation_bootstrap_peers)
    assert peers.address("127.0.0.1", 8998) == "tcp://127.0.0.1:8998"
    assert peers.address("LOCALHOST", 1) == "tcp://127.0.0.1:1"
    assert peers.address("[::1]", 40000) == "tcp://[::1]:40000"
    for host in ("10.0.0.5", "evil.example", "127.0.0.2", "0.0.0.0", "localhost.evil.example"):
        with pytest.raises(ParamError) as info:
            peers.address(host, 8998)
        assert info.value.param == "bootstrap_host"
        message = str(info.value)
        assert "bootstrap_host" in message and "127.0.0.1 (any port)" in message
        assert "--disaggregation-bootstrap-peers" in message


def test_names_are_resolved_once_and_a_request_is_matched_without_resolving():
    calls: list[str] = []

    def resolve(host: str) -> list[str]:
        calls.append(host)
        return {"prefill-a": ["10.1.0.5", "fd00::5"], "10.2.0.9": ["10.2.0.9"]}[host]

    peers = BootstrapPeers("prefill-a:8998,10.2.0.9", resolve)
    assert calls == ["prefill-a", "10.2.0.9"]
    assert peers.address("prefill-a", 8998) == "tcp://10.1.0.5:8998"  # IPv4 first
    assert peers.address("10.1.0.5", 8998) == "tcp://10.1.0.5:8998"
    assert peers.address("fd00:0::5", 8998) == "tcp://[fd00::5]:8998"
    assert peers.address("10.2.0.9", 1234) == "tcp://10.2.0.9:1234"  # no port: any
    with pytest.raises(ParamError, match="prefill-a:8998"):
        peers.address("prefill-a", 8999)  # its port is fixed
    with pytest.raises(ParamError, match="bootstrap_host"):
        peers.address("alias-of-prefill-a", 8998)  # never looked up
    assert calls == ["prefill-a", "10.2.0.9"]


def test_a_configured_name_that_does_not_resolve_fails_at_start_up():
    with pytest.raises(ValueError, match="disaggregation_bootstrap_peers: cannot resolve"):
        BootstrapPeers("no-such-prefill.invalid:8998")


def test_the_frontend_refuses_a_peer_not_configured_before_a_message_is_made():
    info = SimpleNamespace(vocab_size=100, context_length=512, pool_tokens=512)
    decode = SimpleNamespace(
        tokenizer=None, info=info, server_args=ServerArgs(disaggregation_mode="decode")
    )
    fields = dict(input_ids=[1, 2, 3], bootstrap_port=8998, bootstrap_room=1)
    planned, _ = build_requests(decode, make_request(bootstrap_host="127.0.0.1", **fields))
    assert planned[0].msg.bootstrap.host == "127.0.0.1"
    with pytest.raises(ParamError, match="bootstrap_host 'evil.example'") as refused:
        build_requests(decode, make_request(bootstrap_host="evil.example", **fields))
    assert refused.value.param == "bootstrap_host"
    # A prefill server connects to nothing: it takes the host SMG gives it.
    prefill = SimpleNamespace(
        tokenizer=None, info=info, server_args=ServerArgs(disaggregation_mode="prefill")
    )
    planned, _ = build_requests(prefill, make_request(bootstrap_host="10.9.9.9", **fields))
    assert planned[0].msg.bootstrap.host == "10.9.9.9"


def test_a_channel_beyond_loopback_needs_a_key(monkeypatch):
    monkeypatch.delenv("RADIXRT_API_KEY", raising=False)
    monkeypatch.delenv("RADIXRT_DISAGGREGATION_BOOTSTRAP_KEY", raising=False)
    with pytest.raises(ValueError, match="host '0.0.0.0'.*disaggregation_bootstrap_key"):
        ServerArgs(disaggregation_mode="prefill", host="0.0.0.0")
    with pytest.raises(ValueError, match="10.0.0.5:8998.*disaggregation_bootstrap_key"):
        ServerArgs(disaggregation_mode="decode", disaggregation_bootstrap_peers="10.0.0.5:8998")
    ServerArgs(disaggregation_mode="prefill", host="127.0.0.1")  # loopback needs none
    ServerArgs(host="0.0.0.0")  # nor a server that is not disaggregated
    keyed = ServerArgs(disaggregation_mode="prefill", host="0.0.0.0", api_key="api")
    assert keyed.bootstrap_key == "api"  # the API key, when the channel has none of its own
    own = ServerArgs(disaggregation_mode="prefill", api_key="api", disaggregation_bootstrap_key="b")
    assert own.bootstrap_key == "b"
    monkeypatch.setenv("RADIXRT_DISAGGREGATION_BOOTSTRAP_KEY", "from-env")
    args = ServerArgs(disaggregation_mode="decode", disaggregation_bootstrap_peers="10.0.0.5")
    assert args.bootstrap_key == "from-env"
