"""The sparse mixture-of-experts MLP (transformers' Qwen3MoeSparseMoeBlock), and the expert
tensors of checkpoints split into the per-expert weights it holds.

Routing, as transformers computes it: router logits x @ W_r.T in x's dtype, softmax in float32,
the top k, with `norm_topk_prob` divided by their sum (still float32), then cast to x's dtype.

Each expert is a gated MLP of its own (`Expert`: `gate_up_proj` merged from the checkpoint's
`experts.{e}.gate_proj` / `up_proj`, and `down_proj`), so every expert projection is a
PackableLinear: a GGUF file's expert blocks stay packed per expert, --quantization int4/int8
quantizes them like any linear layer, and tensor parallelism shards each expert's intermediate
size as it shards a dense MLP's (gate/up rows, down columns), the router replicated, one
all-reduce after the experts' weighted sum.

A step groups its tokens by expert: the (token, slot) pairs sorted by expert, stably, so in
token order within one; each active expert multiplies all its rows at once (its weights are
read once a step, however many tokens chose it); each output, times its routing weight in x's
dtype, goes to its pair's own row of a [T, k, hidden] buffer, which is then summed over k.
That is the order and the ops of transformers' default experts path (`grouped_mm`, whose
[T, k, hidden] `.sum(dim=1)` we repeat exactly); its eager loop adds in ascending expert order
instead, the same sum for k = 2 (a + b == b + a) and within rounding for more. Deterministic:
no atomic or order-dependent accumulation anywhere.

The experts to run are decided on the host (one sync a layer), so a model with this block runs
neither under CUDA graphs nor under torch.compile (`CausalLM.static_graphs`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, overload

import torch
from torch import nn

from radixrt.distributed import TPGroup
from radixrt.layers.config import MoEConfig
from radixrt.layers.fused import dense_linear
from radixrt.layers.mlp import GatedMLP
from radixrt.layers.sharding import CheckpointTensor, LazyTensor, Narrow


class Routing(NamedTuple):
    weights: torch.Tensor  # [T, k], x's dtype: each chosen expert's share of the token
    experts: torch.Tensor  # [T, k] int64: the chosen experts, most probable first


class TopKRouter(nn.Module):
    """The router (`mlp.gate.weight`, [num_experts, hidden]); replicated on every rank. Not a
    PackableLinear, so quantization never touches it: routing stays transformers'."""

    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        self.top_k = moe.top_k
        self.norm_topk_prob = moe.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> Routing:  # x [T, hidden]
        logits = dense_linear(x, self.weight)  # one order per row, whatever the batch
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return Routing(top.to(logits.dtype), experts)


class Expert(GatedMLP):
    """One expert: a gated MLP whose output is this rank's partial sum (no all-reduce: the
    block reduces once, after weighting and adding the experts' outputs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, hidden]
        return self.down_proj.linear(self.act_and_mul(self.gate_up_proj(x)), None)


class SparseMoE(nn.Module):
    """x [T, hidden] -> sum over each token's top-k experts of weight * expert(x) [T, hidden].

    Parameters: `gate.weight` (the router) and `experts.{e}.gate_up_proj` / `down_proj`."""

    def __init__(
        self, hidden_size: int, moe: MoEConfig, group: TPGroup | None = None, act: str = "silu"
    ) -> None:
        super().__init__()
        self.group = group or TPGroup.single()
        self.gate = TopKRouter(hidden_size, moe)
        self.experts = nn.ModuleList(
            Expert(hidden_size, moe.intermediate_size, False, self.group, act)
            for _ in range(moe.num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routing = self.gate(x)
        t, k = routing.experts.shape
        y = self.expert_outputs(x, routing).view(t, k, x.shape[-1]).sum(dim=1)
        return y if self.group.size == 1 else self.group.all_reduce(y)

    def expert_outputs(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """[T * k, hidden]: row t * k + j is token t's j-th expert's output times its weight."""
        k = routing.experts.shape[1]
        chosen = routing.experts.reshape(-1)  # [T * k]
        pairs = torch.argsort(chosen, stable=True)  # grouped by expert, tokens in order
        counts = torch.bincount(chosen, minlength=len(self.experts)).tolist()  # the one sync
        weights = routing.weights.reshape(-1, 1)
        out = x.new_empty(chosen.shape[0], x.shape[-1])
        start = 0
        for expert, n in zip(self.experts, counts, strict=True):
            if n:
                mine = pairs[start : start + n]
                out[mine] = expert(x[mine // k]) * weights[mine]
                start += n
        return out


# -- checkpoint tensors holding every expert -------------------------------------------------

# transformers 5's fused form: gate_up_proj [E, 2I, hidden] (gate rows first), down_proj
# [E, hidden, I]; llama.cpp's converter's stacks, named before it renames them:
# experts.{gate,up,down}_proj.weight [E, out, in].
_STACKED = re.compile(
    r"((?:.*\.)?experts)\.(gate_up_proj|(?:gate|up|down)_proj\.weight|down_proj)$"
)


def expert_names(name: str, num_experts: int) -> list[str] | None:
    """The per-expert checkpoint names a tensor holding all experts (`name`) splits into,
    expert by expert (gate before up for a fused gate_up_proj); None for any other tensor."""
    found = _STACKED.fullmatch(name)
    if found is None:
        return None
    prefix, kind = found.groups()
    projections = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}.get(
        kind, (kind.removesuffix(".weight"),)
    )
    return [f"{prefix}.{e}.{p}.weight" for e in range(num_experts) for p in projections]


@overload
def split_experts(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None: ...
@overload
def split_experts(
    name: str, tensor: CheckpointTensor
) -> list[tuple[str, CheckpointTensor]] | None: ...
def split_experts(name: str, tensor: CheckpointTensor) -> list[tuple[str, Any]] | None:
    """A tensor of all experts ([E, rows, cols]) as per-expert (name, [rows or rows / 2, cols])
    tensors, in expert_names' order: views of an in-memory tensor, or lazy parts of a lazy one
    (each reads its expert's rows whole, then the part a rank asks for). None for any other."""
    names = expert_names(name, tensor.shape[0]) if len(tensor.shape) == 3 else None
    if names is None:
        return None
    per_expert = len(names) // tensor.shape[0]  # 2 for a fused gate_up_proj
    rows = tensor.shape[1] // per_expert
    parts: list[CheckpointTensor] = [
        _expert_rows(tensor, i // per_expert, i % per_expert * rows, rows)
        for i in range(len(names))
    ]
    return list(zip(names, parts, strict=True))


def unstack_experts(
    weights: Iterable[tuple[str, CheckpointTensor]],
) -> Iterator[tuple[str, CheckpointTensor]]:
    """The weights with every all-experts tensor split per expert (split_experts)."""
    for name, tensor in weights:
        yield from split_experts(name, tensor) or [(name, tensor)]


def _expert_rows(tensor: CheckpointTensor, expert: int, start: int, rows: int) -> CheckpointTensor:
    if isinstance(tensor, torch.Tensor):
        return tensor[expert].narrow(0, start, rows)
    return _LazyExpertRows(tensor, expert, start, rows)


class _LazyExpertRows:
    """Rows [start, start + rows) of one expert of a lazily read [E, rows, cols] tensor."""

    def __init__(self, source: LazyTensor, expert: int, start: int, rows: int) -> None:
        self.source, self.expert, self.start = source, expert, start
        self.shape = (rows, source.shape[2])

    def read(self, narrow: Narrow | None) -> torch.Tensor:
        whole = self.source.read(Narrow(0, self.expert, 1, self.source.shape[0]))[0]
        part = whole.narrow(0, self.start, self.shape[0])
        return part if narrow is None else narrow.apply(part)
