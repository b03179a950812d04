"""Jump-forward decoding: when the grammar admits only one continuation for the next
characters (a JSON object's keys and punctuation), append their tokens at once instead of
sampling them one decode step each; the next step computes them all as one extend.

The tokens are those the tokenizer itself would write: the last sampled token (whose K/V is not
computed yet, so replacing it costs nothing) is re-tokenized together with the forced text, and
the result is kept only if it decodes, in context, to exactly the same text.
"""

from __future__ import annotations

from typing import Any


def jump_forward(output_ids: list[int], matcher: Any, tokenizer: Any, room: int) -> int:
    """Extend `output_ids` (in place) by the forced continuation, at most `room` tokens more.
    The matcher has accepted every id in output_ids and accepts the new ones. Returns how many
    tokens were added (0: nothing forced, or no safe tokenization)."""
    forced = matcher.find_jump_forward_string()
    if not forced or room <= 0 or not output_ids:
        return 0
    last = output_ids[-1]
    ctx = output_ids[-2:-1]  # one token of context: the tokenizer places spaces by it
    base = tokenizer.decode(ctx, skip_special_tokens=False)
    want = tokenizer.decode(ctx + [last], skip_special_tokens=False) + forced
    merged = tokenizer.encode(want[len(base):], add_special_tokens=False)
    if merged and merged[0] != last and _decodes_to(tokenizer, ctx + merged, want):
        matcher.rollback(1)  # re-take the boundary with the retokenized last token
        added = _accept(matcher, merged[:room + 1])
        if added:
            output_ids[-1:] = added
            return len(added) - 1
        matcher.accept_token(last)  # nothing fitted: restore the sampled token
        return 0
    tail = merged[1:] if merged[:1] == [last] else tokenizer.encode(
        forced, add_special_tokens=False)
    if not _decodes_to(tokenizer, ctx + [last] + tail, want):
        return 0
    added = _accept(matcher, tail[:room])
    output_ids.extend(added)
    return len(added)


def _decodes_to(tokenizer: Any, ids: list[int], text: str) -> bool:
    return tokenizer.decode(ids, skip_special_tokens=False) == text


def _accept(matcher: Any, ids: list[int]) -> list[int]:
    """Feed ids to the matcher until one is refused; the accepted prefix."""
    accepted = []
    for t in ids:
        if not matcher.accept_token(t):
            break
        accepted.append(t)
    return accepted
