"""Reference generation with Hugging Face transformers, one prompt at a time, in float32.

A module of its own (not conftest.py): test modules import it by name, and several
conftest.py files in tests/ would shadow one another under that name."""

from __future__ import annotations

from dataclasses import dataclass

import torch

TIE_GAP = 1e-4  # a divergence is allowed only where the reference's top two logits are this close


@dataclass
class Reference:
    tokens: list[int]
    gaps: list[float]  # top-1 minus top-2 logit at each generated step
    prompt_logprobs: list[float]  # logprob of prompt token t given tokens < t, for t >= 1
    output_logprobs: list[float]


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new: int) -> Reference:
    """Greedy decoding by full recomputation at every step: no KV cache API involved, so the
    reference does not depend on transformers' cache classes."""
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
    for i, (a, b) in enumerate(zip(ours, ref.tokens)):
        if a != b:
            assert ref.gaps[i] < TIE_GAP, (
                f"{label}: token {i} is {a}, reference {b} (top-2 gap {ref.gaps[i]:.2e}); "
                f"ours {ours}, reference {ref.tokens}")
            print(f"{label}: divergence at a tie, step {i} (gap {ref.gaps[i]:.2e})")
            return
    assert len(ours) == len(ref.tokens), f"{label}: {len(ours)} tokens, want {len(ref.tokens)}"
