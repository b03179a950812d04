"""SGLang's bootstrap fields of one request, turned into one `Bootstrap` per scheduler message.

A gateway in front of a prefill/decode pair (SMG's `--pd-disaggregation`) sends both servers
the same body with `bootstrap_host` (the prefill server's host), `bootstrap_port` (its
bootstrap port; null: this server's --disaggregation-bootstrap-port) and `bootstrap_room` (the
id both servers know the KV transfer by), each a value or a list. The two servers must derive
the same room for each request the body makes, so the rule is SGLang's, kept exactly
(`GenerateReqInput._normalize_bootstrap_params`, managers/io_struct.py), with num = prompts x n:
- a scalar room becomes `[room + k for k in range(num)]`; a scalar host or port `[value] * num`;
- a list becomes `list * n` (radixrt takes a list of one entry per prompt or per request);
and entry k belongs to SGLang's k-th request. SGLang orders a batch's requests sample-major
(`text * n`: k = j * prompts + i for sample j of prompt i); radixrt's messages are
prompt-major (rids rid-0, rid-1, ... per prompt), so message (i, j) takes entry j * prompts + i.

A decode server connects to bootstrap_host, so it must be one of its
--disaggregation-bootstrap-peers (disaggregation/peers.py): any other is a 400 naming
bootstrap_host, before the request is queued. A prefill server connects to nothing and takes
the host as it comes.

Each request must get its own room (the servers key transfers by it): a list of one room per
prompt with n > 1 would give a prompt's samples one room under that rule, so it is refused.
"""

from __future__ import annotations

from typing import Any

from radixrt.disaggregation.peers import bootstrap_peers
from radixrt.errors import ParamError
from radixrt.protocol.messages import Bootstrap
from radixrt.protocol.request_input import GenerateReqInput
from radixrt.protocol.request_limits import (
    BOOTSTRAP_ROOM_MAX,
    validate_bootstrap_host,
    validate_bootstrap_port,
    validate_bootstrap_room,
    validate_disaggregated,
)

FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
_CHECKS = {
    "bootstrap_host": validate_bootstrap_host,
    "bootstrap_port": validate_bootstrap_port,
    "bootstrap_room": validate_bootstrap_room,
}


def plan_bootstraps(
    req: GenerateReqInput, ns: list[int], args: Any
) -> list[list[Bootstrap]] | None:
    """For each prompt (`ns`: the n each asks for), the Bootstrap of each of its n messages;
    None when the request carries no bootstrap field: it is then served as on any server (a
    gateway's health checks send none). ParamError naming the field for a server that is not
    disaggregated, a missing host or room, a bad value, lists of the wrong length, prompts
    with different n, or two requests with one room. `args`: the ServerArgs."""
    given = [name for name in FIELDS if _given(getattr(req, name))]
    if not given:
        return None
    validate_disaggregated(given[0], args.disaggregation_mode)
    for name in ("bootstrap_host", "bootstrap_room"):
        if name not in given:
            raise ParamError(
                name, f"{name} is required with {' and '.join(given)} (SGLang's bootstrap)"
            )
    n = _common_n(ns)
    columns = {name: _normalized(getattr(req, name), name, len(ns), n) for name in FIELDS}
    plan = [[_bootstrap(columns, j * len(ns) + i, args) for j in range(n)] for i in range(len(ns))]
    _check_distinct(plan, len(ns) * n)
    return plan


def _given(value: Any) -> bool:
    """Set: not null, and not a list of nulls (room 0 is a room)."""
    if isinstance(value, list):
        return any(v is not None for v in value)
    return value is not None


def _common_n(ns: list[int]) -> int:
    if len(set(ns)) > 1:
        raise ParamError(
            "n",
            f"with bootstrap fields every prompt must ask for the same n (as SGLang), got {ns}",
        )
    return ns[0]


def _normalized(value: Any, name: str, prompts: int, n: int) -> list[Any]:
    """SGLang's expansion of one field to num = prompts x n entries (a scalar room counts
    up); each given value checked first, naming its index in a list."""
    num = prompts * n
    if value is None:
        return [None] * num
    if not isinstance(value, list):
        _check(name, value, "")
        return [value + k for k in range(num)] if name == "bootstrap_room" else [value] * num
    if len(value) not in (prompts, num):
        per_request = f", or one per request (prompts x n = {num})" if num != prompts else ""
        raise ParamError(
            name,
            f"{name} has {len(value)} entries for {prompts} prompt(s) with n={n}: give one "
            f"value, one per prompt ({prompts}){per_request}",
        )
    for i, item in enumerate(value):
        _check(name, item, f"[{i}]")
    return value * n


def _check(name: str, value: Any, where: str) -> None:
    if value is not None or name != "bootstrap_port":  # a null port: the server's own
        _CHECKS[name](value, where)


def _bootstrap(columns: dict[str, list[Any]], k: int, args: Any) -> Bootstrap:
    """Entry k of the expanded fields as one Bootstrap; a null port is this server's."""
    room = columns["bootstrap_room"][k]
    if room > BOOTSTRAP_ROOM_MAX:  # only a scalar room counting up gets here
        raise ParamError(
            "bootstrap_room",
            f"bootstrap_room counts up once per request (prompts x n) and request {k} "
            f"would get room {room}, past 2**63-1: give a smaller room",
        )
    port = columns["bootstrap_port"][k]
    host = columns["bootstrap_host"][k]
    boot = Bootstrap(host, args.disaggregation_bootstrap_port if port is None else port, room)
    if args.disaggregation_mode == "decode":  # it will connect there: only to a listed peer
        bootstrap_peers(args.disaggregation_bootstrap_peers).address(boot.host, boot.port)
    return boot


def _check_distinct(plan: list[list[Bootstrap]], num: int) -> None:
    rooms = {b.room for row in plan for b in row}
    if len(rooms) < num:
        raise ParamError(
            "bootstrap_room",
            f"bootstrap_room gives the {num} requests (prompts x n) of this body only "
            f"{len(rooms)} distinct room(s); each needs its own (a list of one room per "
            "prompt is repeated for each of the n samples, as SGLang does): give one room "
            f"(it counts up), or {num} distinct rooms, one per prompt and sample",
        )
