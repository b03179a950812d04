"""Log-probabilities reported to users, from the raw logits.

As in SGLang, they come from log_softmax of the model's logits before penalties and temperature:
they describe the model, not the sampling recipe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class LogprobsResult(NamedTuple):
    """N = rows (tokens asked about), k = top_k."""

    token_logprobs: torch.Tensor  # [N] float32, logprob of token_ids[i] in row i
    top_values: torch.Tensor  # [N, k] float32, descending
    top_indices: torch.Tensor  # [N, k] int64, token ids of top_values
    all_logprobs: torch.Tensor  # [N, V] float32, every token's (for token_ids_logprob)


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, top_k: int) -> LogprobsResult:
    """Logprob of each chosen token and the k most likely tokens of each row.

    logits [N, V] (any float dtype; computed in float32), token_ids [N] int64, top_k >= 0
    (0 gives [N, 0] tensors; it is clamped to V). Nothing is mutated.
    """
    assert logits.dim() == 2 and token_ids.shape == (logits.shape[0],), (
        logits.shape,
        token_ids.shape,
    )
    assert top_k >= 0, top_k
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)  # [N, V]
    chosen = logprobs.gather(1, token_ids.long().unsqueeze(1)).squeeze(1)  # [N]
    k = min(top_k, logprobs.shape[-1])
    top_values, top_indices = logprobs.topk(k, dim=-1, sorted=True)
    return LogprobsResult(chosen, top_values, top_indices, logprobs)
