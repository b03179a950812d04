"""Llama for causal LM, over the paged KV pool; the base of the Qwen2 and Mistral models.

q/k/v and gate/up are fused into single matmuls; `load_weights` takes Hugging Face names and
fills the fused weights shard by shard.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from radixrt.executor.forward_batch import ForwardBatch
from radixrt.layers.activation import silu_and_mul
from radixrt.layers.norm import RMSNorm
from radixrt.layers.rotary import RotaryEmbedding, rope_parameters, rotate_qk

# Hugging Face projection name -> (fused projection, shard index within it).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def head_dim_of(config: PretrainedConfig) -> int:
    """The attention head size: `head_dim` when the config sets it, else hidden / heads."""
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"hidden_size ({config.hidden_size}) must be a multiple of num_attention_heads "
                f"({config.num_attention_heads}) when head_dim is not set"
            )
        head_dim = config.hidden_size // config.num_attention_heads
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    return head_dim


def num_kv_heads_of(config: PretrainedConfig) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


class LlamaAttention(nn.Module):
    def __init__(
        self, config: PretrainedConfig, layer_id: int, qkv_bias: bool, o_bias: bool
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = num_kv_heads_of(config)
        self.head_dim = head_dim_of(config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scaling = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, o_bias)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        t = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, (Hq + 2 Hkv) * D]
        # q and k heads side by side get one rotary call: [T, Hq + Hkv, D] (in place on CUDA).
        qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
        qk = rotate_qk(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        out = fb.attn_backend.forward(q, k, v, self.layer_id, fb, self.scaling)  # [T, Hq, D]
        return self.o_proj(out.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: PretrainedConfig, layer_id: int, qkv_bias: bool, o_bias: bool, mlp_bias: bool
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, qkv_bias, o_bias)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]: the previous layer's MLP output (or the embeddings)
        residual: torch.Tensor | None,  # [T, hidden]: the residual stream before that output
        cos: torch.Tensor,
        sin: torch.Tensor,
        fb: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (MLP output, residual stream), [T, hidden] each
        # The residual add is deferred into the next norm, where CUDA fuses the two; the sums
        # are the same as hidden + attn(norm(hidden)), then + mlp(norm(.)).
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, fb)
        hidden, residual = self.post_attention_layernorm.add_and_norm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(
        self, config: PretrainedConfig, qkv_bias: bool, o_bias: bool, mlp_bias: bool
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, qkv_bias, o_bias, mlp_bias)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(head_dim_of(config), rope_parameters(config))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        if fb.attn_metadata is None:
            fb.attn_backend.init_forward_metadata(fb)
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)  # [T, 1, D/2] each
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, fb)
        if residual is None:  # a model without layers
            return self.norm(hidden)
        return self.norm.add_and_norm(hidden, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Model API shared by every architecture.

    `forward(input_ids [T], positions [T], fb) -> hidden [T, hidden]` (after the final norm);
    it calls `fb.attn_backend.init_forward_metadata(fb)` itself when the runner has not.
    `compute_logits(hidden [N, hidden]) -> [N, vocab]` float32.
    `load_weights(...)` takes (Hugging Face name, tensor) pairs; see its docstring.
    Raises ValueError, naming the field, for a config it can't honour.
    """

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.check_config(config)
        self.config = config
        qkv_bias, o_bias, mlp_bias = self.biases(config)
        self.model = LlamaModel(config, qkv_bias, o_bias, mlp_bias)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        # Tied: the logits reuse embed_tokens.weight, so there is no lm_head parameter at all.
        self.lm_head = None
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        head_dim = head_dim_of(config)
        q_size = config.num_attention_heads * head_dim
        kv_size = num_kv_heads_of(config) * head_dim
        self._shard_sizes = {
            "qkv_proj": [q_size, kv_size, kv_size],
            "gate_up_proj": [config.intermediate_size] * 2,
        }

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """Raise ValueError, naming the field, for settings this model can't honour."""
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {act!r}")
        if config.num_attention_heads % num_kv_heads_of(config):
            raise ValueError(
                f"num_key_value_heads ({num_kv_heads_of(config)}) must divide "
                f"num_attention_heads ({config.num_attention_heads})"
            )
        head_dim_of(config)
        rope_parameters(config)

    @classmethod
    def biases(cls, config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """(qkv_proj, o_proj, mlp) bias flags."""
        attn = bool(getattr(config, "attention_bias", False))
        return attn, attn, bool(getattr(config, "mlp_bias", False))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        return self.model(input_ids, positions, fb)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, V]
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        # In the model dtype like the reference, then float32 for sampling.
        return F.linear(hidden, weight).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into the parameters (cast to their dtype/device).

        Ignores `rotary_emb.inv_freq` and, with tied embeddings, `lm_head.weight`. Raises
        ValueError for an unknown name, a shape mismatch, or parameters the weights don't cover.
        """
        params = dict(self.named_parameters())
        expected = self.hf_weight_names()
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue
            if name not in expected:
                raise ValueError(f"unexpected weight {name!r} for {type(self).__name__}")
            self._load_one(params, name, tensor)
            loaded.add(name)
        missing = sorted(expected - loaded)
        if missing:
            shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise ValueError(f"missing weights for {len(missing)} parameter(s): {shown}")

    def hf_weight_names(self) -> set[str]:
        """The Hugging Face parameter names this model needs."""
        names = set()
        for name, _ in self.named_parameters():
            fused = [hf for hf, (ours, _) in _FUSED.items() if f".{ours}." in name]
            for hf in fused:
                names.add(name.replace(f".{_FUSED[hf][0]}.", f".{hf}."))
            if not fused:
                names.add(name)
        return names

    def _load_one(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> None:
        target, shard = name, None
        for hf, (ours, index) in _FUSED.items():
            if f".{hf}." in name:
                target, shard = name.replace(f".{hf}.", f".{ours}."), (ours, index)
        param = params[target]
        dst = param.data
        if shard is not None:
            sizes = self._shard_sizes[shard[0]]
            dst = dst.narrow(0, sum(sizes[: shard[1]]), sizes[shard[1]])
        if dst.shape != tensor.shape:
            raise ValueError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
            )
        if shard is None:
            # Adopt the tensor rather than copy it into the empty parameter: saves a pass over
            # freshly allocated memory (a third of the GGUF load time on the CPU).
            param.data = tensor.to(device=dst.device, dtype=dst.dtype).contiguous()
        else:
            with torch.no_grad():
                dst.copy_(tensor)
