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


def propose(matcher: Any, tokenizer: Any, room: int) -> list[int]:
    """The tokens of the text the grammar forces next (at most `room`), already accepted by the
    matcher; [] when nothing is forced. Any tokenization the matcher accepts is safe: the
    model checks every proposed token before it counts."""
    if room <= 0:
        return []
    forced = matcher.find_jump_forward_string()
    if not forced:
        return []
    accepted = []
    for t in tokenizer.encode(forced, add_special_tokens=False)[:room]:
        if not matcher.accept_token(t):
            break
        accepted.append(t)
    return accepted
