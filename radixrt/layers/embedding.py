"""The language-model head: final hidden states to vocabulary logits, tied or not."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LMHead(nn.Module):
    """logits = hidden @ W.T in float32.

    Untied, W is this module's own `weight` [vocab, hidden]; tied, it has no parameter at all
    (`weight` is None) and uses the token embedding's matrix, passed to `forward`. Holding no
    reference to the embedding module keeps the tie intact when the model is moved or built on
    the meta device.
    """

    weight: nn.Parameter | None

    def __init__(self, hidden_size: int, vocab_size: int, tied: bool) -> None:
        super().__init__()
        if tied:
            self.register_parameter("weight", None)
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    def forward(self, hidden: torch.Tensor, embedding: nn.Embedding) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32."""
        weight = embedding.weight if self.weight is None else self.weight
        # The matmul in the model dtype like the reference, then float32 for sampling.
        return F.linear(hidden, weight).float()
