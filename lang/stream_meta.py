"""A streamed gen's meta_info, chunk by chunk, as SGLang's interpreter hands it out.

Servers stream logprobs in two ways: radixrt (and SGLang without incremental output) repeats
every entry so far in each chunk, SGLang's streaming /generate sends only the new entries.
`StreamMeta` accepts both and gives, per chunk, SGLang's shape: the lists of that chunk's new
entries, `completion_tokens` and `output_token_logprobs_length` counted from the start; and the
whole request's meta_info (every entry) for `get_meta_info` once the gen has ended.
"""

from __future__ import annotations

from typing import Any

# One entry per output token in each of these.
INCREMENTAL_KEYS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


class StreamMeta:
    def __init__(self) -> None:
        self.lists: dict[str, list] = {}
        self.total: dict[str, Any] | None = None

    def add(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Fold one chunk's meta_info in; return that chunk's own (new entries only)."""
        chunk = dict(meta)
        for key in INCREMENTAL_KEYS:
            if meta.get(key) is None:
                continue
            have = self.lists.setdefault(key, [])
            new = _new_entries(list(meta[key]), have, meta.get("completion_tokens"))
            have.extend(new)
            chunk[key] = new
        self.total = {**meta, **{k: list(v) for k, v in self.lists.items()}}
        if "output_token_logprobs" in self.lists:
            length = len(self.lists["output_token_logprobs"])
            chunk["output_token_logprobs_length"] = length
            self.total["output_token_logprobs_length"] = length
        return chunk


def merge_chunks(pending: dict[str, Any] | None, meta: dict[str, Any]) -> dict[str, Any]:
    """Two consecutive chunks' meta_info as one (a chunk whose tokens made no text yet is
    merged into the next one): the later counts, both chunks' new entries."""
    if pending is None:
        return meta
    merged = dict(meta)
    for key in INCREMENTAL_KEYS:
        if key in pending or key in meta:
            merged[key] = list(pending.get(key) or []) + list(meta.get(key) or [])
    return merged


def with_logprob_length(meta: dict[str, Any]) -> dict[str, Any]:
    """SGLang's servers add output_token_logprobs_length to a request with logprobs."""
    if "output_token_logprobs" in meta and "output_token_logprobs_length" not in meta:
        meta = {**meta, "output_token_logprobs_length": len(meta["output_token_logprobs"])}
    return meta


def _new_entries(got: list, have: list, completion_tokens: int | None) -> list:
    """`got` holds every entry so far (then the new ones are its tail) or only the new ones."""
    if not have:
        return got
    if completion_tokens is not None:
        cumulative = len(got) == completion_tokens
    else:
        cumulative = got[: len(have)] == have
    return got[len(have) :] if cumulative else got
