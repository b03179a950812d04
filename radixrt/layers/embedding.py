"""The token embedding and the language-model head, tied or not, split by vocabulary rows over
the tensor-parallel ranks (the vocabulary padded to a multiple of the ranks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixrt.distributed import TPGroup
from radixrt.layers.fused import dense_linear
from radixrt.layers.quantized import GGUFWeight
from radixrt.layers.sharding import Narrow, vocab_split


def _vocab_narrows(vocab_size: int, group: TPGroup) -> dict[str, Narrow]:
    if group.size == 1:
        return {}
    start, held, read = vocab_split(vocab_size, group)
    return {"weight": Narrow(0, start, read, vocab_size, padded=held)}


class VocabParallelEmbedding(nn.Module):
    """Token ids [T] -> rows of `weight` [T, hidden].

    On a rank of a tensor-parallel group `weight` holds rows [start, start + rows) of the padded
    vocabulary (zeros past its end): a rank looks up the ids in its range, zeros the others, and
    an all-reduce sums the ranks' rows. At tp=1 this is exactly nn.Embedding.
    """

    def __init__(self, vocab_size: int, hidden_size: int, group: TPGroup | None = None) -> None:
        super().__init__()
        self.group = group or TPGroup.single()
        self.vocab_size = vocab_size
        self.vocab_start, rows, _ = vocab_split(vocab_size, self.group)
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(rows, hidden_size))
        self.checkpoint_narrows = _vocab_narrows(vocab_size, self.group)
        # Set when the loader keeps the file's blocks (one rank only): rows are dequantized
        # per lookup, exactly as the dense matrix would hold them, instead of kept as floats.
        self.packed: GGUFWeight | None = None
        self.packed_dtype = torch.float32  # the dtype the dense matrix had

    def use_packed(self, packed: GGUFWeight) -> None:
        """Look rows up in `packed` from now on and drop the dense matrix."""
        assert self.weight is not None and self.group.size == 1
        self.packed, self.packed_dtype = packed, self.weight.dtype
        del self.weight
        self.register_parameter("weight", None)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            rows = self.packed.rows(input_ids.reshape(-1)).to(self.packed_dtype)
            return rows.reshape(*input_ids.shape, -1)
        assert self.weight is not None
        if self.group.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(rows.masked_fill(outside[:, None], 0.0))


class LMHead(nn.Module):
    """logits = hidden @ W.T in float32.

    Untied, W is this module's own `weight` [vocab, hidden]; tied, it has no parameter at all
    (`weight` is None) and uses the token embedding's matrix, passed to `forward`. Holding no
    reference to the embedding module keeps the tie intact when the model is moved or built on
    the meta device. With tensor parallelism W holds this rank's vocabulary rows (as the
    embedding does): the ranks' logits are gathered and the padding trimmed.
    """

    weight: nn.Parameter | None
    packed: GGUFWeight | None  # set after loading (quantization): used instead of W

    def __init__(
        self, hidden_size: int, vocab_size: int, tied: bool, group: TPGroup | None = None
    ) -> None:
        super().__init__()
        self.group = group or TPGroup.single()
        self.vocab_size = vocab_size
        if tied:
            self.register_parameter("weight", None)
        else:
            rows = vocab_split(vocab_size, self.group)[1]
            self.weight = nn.Parameter(torch.empty(rows, hidden_size))
        self.checkpoint_narrows = _vocab_narrows(vocab_size, self.group)
        self.packed = None

    def forward(
        self, hidden: torch.Tensor, embedding: VocabParallelEmbedding | nn.Embedding
    ) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32."""
        if self.packed is not None:
            logits = self.packed(hidden)
        else:
            weight = embedding.weight if self.weight is None else self.weight
            assert weight is not None  # a packed embedding's tied head is packed too
            # The matmul in the model dtype like the reference, then float32 for sampling.
            logits = dense_linear(hidden, weight)
        if self.group.size > 1:
            logits = self.group.all_gather(logits, dim=-1)[:, : self.vocab_size]
        return logits.float()
