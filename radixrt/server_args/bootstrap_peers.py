"""The syntax of --disaggregation-bootstrap-peers, and which hosts count as loopback.

Stdlib only and no name resolution: ServerArgs' checks call it, so a bad value fails at the
flags. The decode side resolves the names once, at start-up (disaggregation/peers.py).
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

FIELD = "disaggregation_bootstrap_peers"
DEFAULT_PEERS = "127.0.0.1,localhost,[::1]"  # loopback only, any port


class PeerRule(NamedTuple):
    """One entry of the list: a host (a lowercased name or an IP literal) and a port, or None
    for any port."""

    host: str
    port: int | None

    def describe(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host} (any port)" if self.port is None else f"{host}:{self.port}"


def parse_bootstrap_peers(spec: str) -> tuple[PeerRule, ...]:
    """Comma-separated entries, each `host`, `host:port`, `[v6]` or `[v6]:port` (a bare v6
    address is taken whole, without a port). ValueError naming the field and the forms."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{FIELD} must list at least one host or host:port, got {spec!r:.80}")
    return tuple(_parse_entry(entry.strip()) for entry in spec.split(","))


def _parse_entry(entry: str) -> PeerRule:
    host, port_text = _split(entry)
    if not host or any(c.isspace() or c in "/@[]" for c in host):
        raise ValueError(_bad(entry, "no host"))
    if port_text is None:
        return PeerRule(host.lower(), None)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(_bad(entry, "the port must be in 1..65535"))
    return PeerRule(host.lower(), int(port_text))


def _split(entry: str) -> tuple[str, str | None]:
    """(host, port text or None)."""
    if entry.startswith("["):
        close = entry.find("]")
        rest = entry[close + 1 :] if close > 0 else "?"
        if close < 0 or (rest and not rest.startswith(":")):
            raise ValueError(_bad(entry, "a [v6] address needs its closing bracket"))
        return entry[1:close], rest[1:] if rest else None
    if entry.count(":") > 1:  # a bare IPv6 address: no port
        return entry, None
    host, sep, port = entry.partition(":")
    return host, port if sep else None


def _bad(entry: str, why: str) -> str:
    return (
        f"{FIELD}: entry {entry!r:.80} is not host, host:port, [v6] or [v6]:port ({why}); "
        f"e.g. {DEFAULT_PEERS} (the default: loopback on any port) or 10.0.0.5:8998"
    )


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1); False for every
    interface ("0.0.0.0", "::", "") and any other host."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
