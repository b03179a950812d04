"""Jump-forward decoding: when the grammar admits only one continuation for the next
characters (a JSON object's keys and punctuation), propose their tokens at once instead of
sampling them one decode step each; the next step computes them all as one extend.

The proposal is the forced text as the tokenizer itself writes it. The model then checks it
(radixrt/scheduler/jump_verify.py): the logits of that one extend step give, at every proposed
position, the token the model would have picked under the grammar's mask; the proposal is kept
up to the first disagreement, where the model's own token is taken instead. So the output is
exactly what plain masked decoding would give (same tokens, same distribution when sampling),
and it costs one step per disagreement instead of one per token.
"""

from __future__ import annotations

from typing import Any


def propose(output_ids: list[int], matcher: Any, tokenizer: Any, room: int) -> list[int]:
    """The tokens of the text the grammar forces next (at most `room`), already accepted by the
    matcher; [] when nothing is forced or the tokenizer would not write it that way here."""
    if room <= 0:
        return []
    forced = matcher.find_jump_forward_string()
    if not forced:
        return []
    ids = tokenizer.encode(forced, add_special_tokens=False)[:room]
    ctx = output_ids[-1:]  # one token of context: the tokenizer places spaces by it
    before = tokenizer.decode(ctx, skip_special_tokens=False)
    if not tokenizer.decode(ctx + ids, skip_special_tokens=False).startswith(before):
        return []
    accepted = []
    for t in ids:
        if not matcher.accept_token(t):
            break
        accepted.append(t)
    return accepted
