"""Which prefill servers a decode server may pull KV pages from: --disaggregation-bootstrap-peers,
with its names resolved once, when the list is built (start-up), never per request.

A request's bootstrap_host is matched as written, against the configured names and the
addresses they resolved to: a name the operator did not list is never looked up, so a
request can neither make the server resolve a name of its choosing nor point it at an
address outside the list. Both the frontend (a 400 before the request is queued) and the
decode scheduler (before it opens a socket) ask the same question here.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Callable

from radixrt.errors import ParamError
from radixrt.server_args.bootstrap_peers import FIELD, parse_bootstrap_peers

Resolver = Callable[[str], list[str]]


def resolve_host(host: str) -> list[str]:
    """Every address of `host`, IPv4 first (the prefill side binds what --host gives it,
    most often an IPv4 address). ValueError naming the field if it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise ValueError(f"{FIELD}: cannot resolve {host!r}: {e}") from e
    found = [(family, str(info[0])) for family, _, _, _, info in infos]
    ordered = sorted(found, key=lambda item: item[0] != socket.AF_INET)
    return list(dict.fromkeys(ip for _, ip in ordered))


class BootstrapPeers:
    """The allowed (address, port) pairs; `address()` maps a request's host and port to the
    ZeroMQ address to connect to, or refuses it."""

    def __init__(self, spec: str, resolve: Resolver = resolve_host) -> None:
        self.rules = parse_bootstrap_peers(spec)
        self._ip_of: dict[str, str] = {}  # a configured name or address -> the IP to dial
        self._allowed: set[tuple[str, int | None]] = set()  # (IP, port or None: any)
        for rule in self.rules:
            ips = [_canonical(ip) for ip in resolve(rule.host)]
            self._ip_of.setdefault(_canonical(rule.host), ips[0])
            for ip in ips:
                self._ip_of.setdefault(ip, ip)
                self._allowed.add((ip, rule.port))

    def address(self, host: str, port: int) -> str:
        """tcp://IP:PORT for a request's bootstrap_host and bootstrap_port; ParamError
        naming bootstrap_host and the allowed peers if the list does not hold them."""
        ip = self._ip_of.get(_canonical(host))
        if ip is None or not ({(ip, port), (ip, None)} & self._allowed):
            raise ParamError(
                "bootstrap_host",
                f"bootstrap_host {host!r:.80} with bootstrap_port {port} is not a prefill server "
                f"this decode server pulls from; --{FIELD.replace('_', '-')} allows "
                f"{self.describe()}",
            )
        return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"

    def describe(self) -> str:
        return ", ".join(rule.describe() for rule in self.rules)


@functools.lru_cache(maxsize=4)
def bootstrap_peers(spec: str) -> BootstrapPeers:
    """The list for a flag's value, resolved on first use and kept: the frontend checks every
    request against it without resolving anything again."""
    return BootstrapPeers(spec)


def _canonical(host: str) -> str:
    """One spelling per host: lowercased, brackets off, an IP literal in its short form."""
    host = host.strip().strip("[]").lower()
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host
