"""The one model config: the typed shape of a decoder-only transformer, read once from its
Hugging Face config, plus the EOS ids and dtype the loader adds.

Layers take their scalars from a `TransformerConfig`, never from the raw HF config: the HF
config's spelling (defaults, renamed fields, transformers 4 vs 5) is dealt with here, once.
The scheduler sizes its KV pool and stops from the same object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
GATED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # HF names: SwiGLU, and Gemma's GeGLU


@dataclass(frozen=True, kw_only=True)
class RopeConfig:
    """Rotary embedding settings. `kind` "linear" divides the frequencies by `factor`; "llama3"
    uses `factor`, the two band factors and `original_max_positions` (Llama 3.1 scaling);
    "longrope" (Phi-3) divides them by `short_factor` while a sequence is at most
    `original_max_positions` long and by `long_factor` past that, and scales cos and sin by
    `attention_factor`. `partial` of each head rotates (its first `rotary_dim` dims)."""

    theta: float = 10000.0
    kind: str = "default"  # one of SUPPORTED_ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    partial: float = 1.0  # partial_rotary_factor
    short_factor: tuple[float, ...] = ()  # longrope: one divisor per frequency
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0  # longrope: cos and sin are multiplied by it

    @property
    def switch_length(self) -> int | None:
        """Sequences longer than this take other frequencies (longrope); None: no such length."""
        return self.original_max_positions if self.kind == "longrope" else None

    def freq_dim(self, head_dim: int) -> int:
        """transformers' rotary `dim`: int(head_dim * partial), the frequencies' denominator."""
        return int(head_dim * self.partial)

    def rotary_dim(self, head_dim: int) -> int:
        """How many leading dims of a head rotate: two per frequency (an odd freq_dim rounds
        up, as transformers' cos/sin of len(range(0, dim, 2)) frequencies do)."""
        return 2 * len(range(0, self.freq_dim(head_dim), 2))

    def validate(self, head_dim: int) -> None:
        """ValueError naming the field unless the rotary fits `head_dim`."""
        n = self.rotary_dim(head_dim) // 2
        if n == 0:
            raise ValueError(
                f"partial_rotary_factor ({self.partial}) leaves no rotary dims of head_dim "
                f"{head_dim}"
            )
        for name in ("short_factor", "long_factor"):
            if self.kind == "longrope" and len(getattr(self, name)) != n:
                raise ValueError(
                    f"rope_scaling.{name} must have {n} entries (rotary dims / 2), "
                    f"got {len(getattr(self, name))}"
                )

    @classmethod
    def from_hf(cls, hf: Any) -> RopeConfig:
        """Read `rope_parameters` (transformers >= 5) or `rope_theta` + `rope_scaling` (older).

        Raises ValueError, naming the field, for a rope type or partial rotary factor we can't
        honour.
        """
        params = getattr(hf, "rope_parameters", None)
        if params is None:
            params = dict(getattr(hf, "rope_scaling", None) or {})
            params.setdefault("rope_theta", getattr(hf, "rope_theta", 10000.0))
        if getattr(hf, "original_max_position_embeddings", None) is not None:
            # Phi-3 keeps it beside rope_scaling; transformers gives that one priority.
            params = {
                **params,
                "original_max_position_embeddings": hf.original_max_position_embeddings,
            }
        partial = getattr(hf, "partial_rotary_factor", None) or 1.0
        return cls.from_params(params, partial, getattr(hf, "max_position_embeddings", None))

    @classmethod
    def from_params(
        cls, params: dict[str, Any], partial_default: float = 1.0, max_positions: int | None = None
    ) -> RopeConfig:
        """One set of rope parameters (transformers' `rope_parameters`, or one layer type's
        entry of it); ValueError naming the field for what these layers can't honour.
        `max_positions` (max_position_embeddings) sets longrope's default attention factor."""
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope_scaling.rope_type must be one of {list(SUPPORTED_ROPE_TYPES)}, got {kind!r}"
            )
        partial = params.get("partial_rotary_factor", partial_default)
        if not isinstance(partial, (int, float)) or not 0.0 < partial <= 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial!r}")
        scaling: dict[str, Any] = {}
        if kind in ("linear", "llama3"):
            scaling["factor"] = float(params["factor"])
        if kind == "llama3":
            scaling["low_freq_factor"] = float(params["low_freq_factor"])
            scaling["high_freq_factor"] = float(params["high_freq_factor"])
            scaling["original_max_positions"] = int(params["original_max_position_embeddings"])
        if kind == "longrope":
            scaling.update(_longrope(params, max_positions))
        return cls(theta=float(params["rope_theta"]), kind=kind, partial=float(partial), **scaling)


def _longrope(params: dict[str, Any], max_positions: int | None) -> dict[str, Any]:
    """LongRoPE's fields, with transformers' defaults (_compute_longrope_parameters): the
    factor is max_position_embeddings / original_max_position_embeddings unless given, and
    the attention factor sqrt(1 + ln(factor) / ln(original)) (1 for a factor <= 1)."""
    for name in ("short_factor", "long_factor", "original_max_position_embeddings"):
        if params.get(name) is None:
            raise ValueError(f"rope_scaling.{name} is required for rope_type 'longrope'")
    original = int(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:
        if max_positions is None:
            raise ValueError("rope_scaling.factor is required without max_position_embeddings")
        factor = max_positions / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {
        "original_max_positions": original,
        "short_factor": tuple(float(f) for f in params["short_factor"]),
        "long_factor": tuple(float(f) for f in params["long_factor"]),
        "attention_factor": float(attention),
    }


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """A sparse mixture-of-experts MLP (Qwen3-MoE's): a softmax router picks `top_k` of
    `num_experts` gated MLPs of `intermediate_size` per token. Layers listed in `dense_layers`
    keep the dense MLP of TransformerConfig.intermediate_size instead."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool  # renormalize the top-k probabilities to sum to 1
    dense_layers: tuple[int, ...] = ()

    def sparse(self, layer_id: int) -> bool:
        return layer_id not in self.dense_layers


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """What the layers of a Llama-family decoder need; built by the model class's
    `config_from_hf`, which also decides the architecture's bias flags."""

    architecture: str  # HF architectures[0], e.g. "Qwen3ForCausalLM"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int  # explicit in the HF config where it sets one, else hidden_size / num_heads
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"  # the gated MLP's activation: one of GATED_ACTIVATIONS
    # Per layer, its sliding window (0: full attention); empty: every layer attends fully.
    layer_windows: tuple[int, ...] = ()
    sliding_rope: RopeConfig | None = None  # the windowed layers' rotary, where it differs
    nope_layers: tuple[int, ...] = ()  # layers whose q and k take no rotary (SmolLM3)
    attention_scale: float | None = None  # the scores' scale; None: head_dim ** -0.5
    moe: MoEConfig | None = None  # the experts' shape; None: every MLP dense
    # Set by the loader (loader/load.py), which knows the checkpoint's folder and the dtype:
    eos_token_ids: list[int] = field(
        default_factory=list
    )  # config.json's then generation_config.json's
    dtype: torch.dtype | None = None  # the dtype the weights were loaded in

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def local_kv_heads(self, tp: int) -> int:
        """KV heads of one rank of `tp`: the size of that rank's KV pool (see local_kv_heads)."""
        return local_kv_heads(self.num_kv_heads, tp)

    def window_of(self, layer_id: int) -> int:
        """Layer `layer_id`'s sliding window, 0 where it attends to the whole context."""
        return self.layer_windows[layer_id] if self.layer_windows else 0

    @classmethod
    def from_hf(
        cls,
        hf: Any,
        *,
        qkv_bias: bool = False,
        o_bias: bool = False,
        mlp_bias: bool = False,
        rope: RopeConfig | None = None,
    ) -> TransformerConfig:
        """Read an HF config of a SiLU-gated, RMSNorm, rotary decoder (`rope`: its rotary where
        the architecture reads it itself, as Gemma 3's per-layer-type parameters).

        Raises ValueError, naming the field, for a setting these layers can't honour.
        """
        act = getattr(hf, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {act!r}")
        archs = getattr(hf, "architectures", None) or ["?"]
        head_dim = head_dim_of(hf)
        rope = rope or RopeConfig.from_hf(hf)
        rope.validate(head_dim)
        num_heads = hf.num_attention_heads
        num_kv_heads = getattr(hf, "num_key_value_heads", None) or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_key_value_heads ({num_kv_heads}) must divide "
                f"num_attention_heads ({num_heads})"
            )
        return cls(
            architecture=archs[0],
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.rms_norm_eps),
            rope=rope,
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
        )


def local_kv_heads(num_kv_heads: int, tp: int) -> int:
    """KV heads a tensor-parallel rank holds: its share of them, or one (replicated over
    tp / num_kv_heads ranks) when there are more ranks than KV heads."""
    return max(1, num_kv_heads // tp)


def head_dim_of(hf: Any) -> int:
    """The attention head size: `head_dim` when the config sets it, else hidden / heads.

    Raises ValueError for an odd head size (rotary pairs the halves) or a hidden size that the
    heads don't divide when head_dim is not set.
    """
    head_dim = getattr(hf, "head_dim", None)
    if head_dim is None:
        if hf.hidden_size % hf.num_attention_heads:
            raise ValueError(
                f"hidden_size ({hf.hidden_size}) must be a multiple of num_attention_heads "
                f"({hf.num_attention_heads}) when head_dim is not set"
            )
        head_dim = hf.hidden_size // hf.num_attention_heads
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    return int(head_dim)


def refuse_sliding_window(hf: Any, enabled: bool) -> None:
    """Raise ValueError when sliding-window attention is `enabled` with a window shorter than
    the context: it is not implemented, and a window at least the context long is a no-op."""
    window = getattr(hf, "sliding_window", None)
    if enabled and window is not None and window < hf.max_position_embeddings:
        raise ValueError(
            f"sliding_window ({window}) < max_position_embeddings "
            f"({hf.max_position_embeddings}) is not supported; "
            "sliding_window must be null or >= max_position_embeddings"
        )
