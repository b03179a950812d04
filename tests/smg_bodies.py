"""What SMG 1.13 (SGLang's gateway) sends a prefill/decode pair, as captured from a live SMG:
the unit and server tests of the bootstrap fields start from it."""

from __future__ import annotations

import copy
from typing import Any

SMG_ROOM = 7328172079049744638
_GENERATE_BODY: dict[str, Any] = {
    "text": "Hello",
    "model": "unknown",
    "sampling_params": {"max_new_tokens": 8},
    "return_text_in_logprobs": False,
    "stream": False,
    "log_metrics": True,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
    "bootstrap_host": "127.0.0.1",
    "bootstrap_port": 38998,
    "bootstrap_room": SMG_ROOM,
}


def smg_generate_body(**changes: Any) -> dict[str, Any]:
    """SMG's re-serialized /generate body, with `changes` applied (a fresh copy)."""
    return {**copy.deepcopy(_GENERATE_BODY), **changes}
