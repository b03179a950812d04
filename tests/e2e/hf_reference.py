"""Reference generation with Hugging Face transformers, one prompt at a time, in float32.

A module of its own (not conftest.py): test modules import it by name, and several
conftest.py files in tests/ would shadow one another under that name.

References are memoized for the session per (model object, prompt): the equivalence tests ask
for the same prompts under every engine setting, and the reference does not depend on it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import torch

TIE_GAP = 1e-4  # a divergence is allowed only where the reference's top two logits are this close


@dataclass(frozen=True)
class Reference:
    tokens: list[int]
    gaps: list[float]  # top-1 minus top-2 logit at each generated step
    prompt_logprobs: list[float]  # logprob of prompt token t given tokens < t, for t >= 1
    output_logprobs: list[float]

    def first(self, n: int) -> Reference:
        """The reference of the first n generated steps (fresh lists: callers may keep them)."""
        return replace(
            self,
            tokens=self.tokens[:n],
            gaps=self.gaps[:n],
            prompt_logprobs=list(self.prompt_logprobs),
            output_logprobs=self.output_logprobs[:n],
        )


# model -> {prompt: the longest reference computed so far}; weak, so a model can be freed.
_RUNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hf_greedy(model, prompt: list[int], max_new: int) -> Reference:
    """Greedy decoding by full recomputation at every step (see _greedy), memoized: a shorter
    run is the prefix of a longer one, since each step recomputes from the tokens alone."""
    runs = _RUNS.setdefault(model, {})
    ref = runs.get(tuple(prompt))
    if ref is None or len(ref.tokens) < max_new:
        ref = runs[tuple(prompt)] = _greedy(model, prompt, max_new)
    return ref.first(max_new)


@torch.inference_mode()
def _greedy(model, prompt: list[int], max_new: int) -> Reference:
    """No KV cache API involved, so the reference does not depend on transformers' cache
    classes."""
    ids = list(prompt)
    out = model(torch.tensor([ids]))
    prompt_lp = torch.log_softmax(out.logits[0, :-1].float(), -1)
    prompt_logprobs = prompt_lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    tokens, gaps, out_lps = [], [], []
    for step in range(max_new):
        if step:
            out = model(torch.tensor([ids]))
        logits = out.logits[0, -1].float()
        top2 = torch.topk(logits, 2).values
        tok = int(torch.argmax(logits))
        tokens.append(tok)
        gaps.append(float(top2[0] - top2[1]))
        out_lps.append(float(torch.log_softmax(logits, -1)[tok]))
        ids.append(tok)
    return Reference(tokens, gaps, prompt_logprobs, out_lps)


def assert_same_greedy(ours: list[int], ref: Reference, label: str) -> None:
    """Token-for-token equality, except after a step where the reference itself had a tie."""
    for i, (a, b) in enumerate(zip(ours, ref.tokens, strict=False)):  # lengths: below
        if a != b:
            assert ref.gaps[i] < TIE_GAP, (
                f"{label}: token {i} is {a}, reference {b} (top-2 gap {ref.gaps[i]:.2e}); "
                f"ours {ours}, reference {ref.tokens}"
            )
            print(f"{label}: divergence at a tie, step {i} (gap {ref.gaps[i]:.2e})")
            return
    assert len(ours) == len(ref.tokens), f"{label}: {len(ours)} tokens, want {len(ref.tokens)}"
