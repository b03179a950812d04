"""Read a llama.cpp GGUF file as a Hugging Face config plus HF-named float32 weights.

Dequantizes through the `gguf` package and undoes llama.cpp's q/k row permutation, so that the
weights equal what `transformers.AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)`
loads (tests/unit/test_gguf_loader.py checks it), at a fraction of its load time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixrt.layers.gguf_blocks import BY_ID
from radixrt.layers.moe import expert_names, split_experts
from radixrt.loader.gguf_config import GGUFConfig, gguf_config
from radixrt.loader.gguf_metadata import ARCHS, check_architecture, read_gguf

logger = logging.getLogger("radixrt.loader")

# "<arch>.<key>" metadata -> HF config field.
_CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
}
_TOKEN_KEYS = {
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "padding_token_id": "pad_token_id",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3's per-head norms
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # Qwen3-MoE: the router, and each projection of every expert stacked [E, out, in] (the
    # names llama.cpp's converter stacks them under; split per expert by layers/moe.py)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
# Gemma's four norms a layer: llama.cpp's ffn_norm is the one before the MLP there.
_GEMMA_BLOCK_TENSORS = _BLOCK_TENSORS | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# llama.cpp's Gemma 3 defaults where the file says nothing (src/llama-model.cpp): every sixth
# layer global, the others windowed with a rotary base of 10,000.
_GEMMA3_SWA_PATTERN = 6
_GEMMA3_SWA_BASE = 10000.0
# The architectures whose converter permutes q/k rows as Llama's does (SmolLM3's subclasses it).
_PERMUTED_QK = ("llama", "smollm3")
# Phi-3's files keep the checkpoint's stacked projections: attn_qkv, and ffn_up (gate, then up).
_PHI3_BLOCK_TENSORS = _BLOCK_TENSORS | {
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_up": "mlp.gate_up_proj",
}
# Tensors that are config, not weights: Phi-3's LongRoPE factors (read into rope_scaling).
_ROPE_FACTORS = {
    "rope_factors_long.weight": "long_factor",
    "rope_factors_short.weight": "short_factor",
}


class GGUFCheckpoint:
    """One GGUF file, opened once (memory-mapped) for both its config and its weights."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        self._meta, self._tensors = read_gguf(self.path)
        self.gguf_arch = check_architecture(str(self._meta.get("general.architecture")))
        self._tensor_names = {t.name for t in self._tensors}
        self._config: GGUFConfig | None = None

    def _field(self, key: str, default: Any = None) -> Any:
        return self._meta.get(key, default)

    def hf_config(self) -> GGUFConfig:
        """The Hugging Face config the file describes (architectures set, tied if no output),
        as gguf_config.py's plain object rather than transformers' class."""
        if self._config is None:
            self._config = self._read_config()
        return self._config

    def _read_config(self) -> GGUFConfig:
        return gguf_config(ARCHS[self.gguf_arch][0], self.config_fields())

    def config_fields(self) -> dict[str, Any]:
        """The HF config fields the file sets (transformers' class names for them)."""
        architecture = ARCHS[self.gguf_arch][1]
        kwargs: dict[str, Any] = {"architectures": [architecture]}
        for key, hf_key in _CONFIG_KEYS.items():
            value = self._field(f"{self.gguf_arch}.{key}")
            if value is not None:
                kwargs[hf_key] = value
        if "vocab_size" not in kwargs:
            kwargs["vocab_size"] = len(self._meta["tokenizer.ggml.tokens"])
        for key, hf_key in _TOKEN_KEYS.items():
            value = self._field(f"tokenizer.ggml.{key}")
            if value is not None:
                kwargs[hf_key] = value
        kwargs.update(self._head_dim())
        kwargs.update(self._rope_scaling())
        if self.gguf_arch == "gemma3":
            kwargs.update(self._gemma3())
        if self.gguf_arch == "qwen3moe":
            kwargs.update(self._qwen3moe(kwargs))
        if self.gguf_arch == "phi3":
            kwargs.update(self._phi3())
        kwargs["tie_word_embeddings"] = "output.weight" not in self._tensor_names
        return kwargs

    def _head_dim(self) -> dict[str, Any]:
        # llama.cpp writes attention.key_length where the head size is not hidden / heads
        # (Qwen3: 128 whatever the width). For Llama, transformers reads rope.dimension_count.
        key_length = self._field(f"{self.gguf_arch}.attention.key_length")
        if key_length is not None:
            return {"head_dim": key_length}
        rope_dim = self._field(f"{self.gguf_arch}.rope.dimension_count")
        if self.gguf_arch in _PERMUTED_QK and rope_dim is not None:
            return {"head_dim": rope_dim}
        return {}

    def _gemma3(self) -> dict[str, Any]:
        arch = self.gguf_arch
        pattern = self._field(f"{arch}.attention.sliding_window_pattern", _GEMMA3_SWA_PATTERN)
        layers, heads = (
            self._field(f"{arch}.block_count"),
            self._field(f"{arch}.attention.head_count"),
        )
        # llama.cpp scales the scores by head_dim ** -0.5, but for the 62-layer 27B by
        # (hidden / heads) ** -0.5: the query_pre_attn_scalar of each released config.
        scalar = self._field(f"{arch}.attention.key_length")
        if layers == 62:
            scalar = self._field(f"{arch}.embedding_length") // heads
        return {
            # transformers' Gemma 3 generation_config stops at <end_of_turn> as well as <eos>
            # (llama.cpp: an end-of-generation token by its text).
            "eos_token_id": [
                self._field("tokenizer.ggml.eos_token_id"),
                *self._token_ids("<end_of_turn>"),
            ],
            "sliding_window": self._field(f"{arch}.attention.sliding_window"),
            "sliding_window_pattern": int(pattern),
            "rope_local_base_freq": self._field(f"{arch}.rope.freq_base_swa", _GEMMA3_SWA_BASE),
            "query_pre_attn_scalar": scalar,
            "layer_types": [
                "full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention"
                for i in range(layers)
            ],
        }

    def _phi3(self) -> dict[str, Any]:
        """What Phi-3's converter writes besides the common keys: the pretraining context
        (rope.scaling.original_context_length), the rotated dims of a head (partial rotary),
        the window (0: none), LongRoPE's factors as two tensors and its attention factor. As the
        releases' generation configs, <|end|> stops as well as the file's EOS."""
        arch = self.gguf_arch
        head_dim = self._field(f"{arch}.embedding_length") // self._field(
            f"{arch}.attention.head_count"
        )
        rope_dim = self._field(f"{arch}.rope.dimension_count", head_dim)
        out: dict[str, Any] = {
            "partial_rotary_factor": rope_dim / head_dim,
            "sliding_window": self._field(f"{arch}.attention.sliding_window") or None,
        }
        eos = [self._field("tokenizer.ggml.eos_token_id"), *self._token_ids("<|end|>")]
        if eos[0] is not None:
            out["eos_token_id"] = list(dict.fromkeys(eos))
        original = self._field(f"{arch}.rope.scaling.original_context_length")
        if original is not None:
            out["original_max_position_embeddings"] = original
        factors = {
            key: [float(f) for f in t.data] for t in self._tensors
            if (key := _ROPE_FACTORS.get(t.name)) is not None
        }  # fmt: skip
        if factors:
            scaling: dict[str, Any] = {"rope_type": "longrope", **factors}
            attention = self._field(f"{arch}.rope.scaling.attn_factor")
            if attention is not None:
                scaling["attention_factor"] = float(attention)
            out["rope_scaling"] = scaling
        return out

    def _qwen3moe(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        # llama.cpp's qwen3moe graph: every layer sparse, the top-k weights renormalized
        # (build_moe_ffn's norm_w), experts of n_ff / n_expert_used where the file does not
        # say expert_feed_forward_length.
        out: dict[str, Any] = {"norm_topk_prob": True, "mlp_only_layers": []}
        if "moe_intermediate_size" not in kwargs:
            used = kwargs["num_experts_per_tok"]
            out["moe_intermediate_size"] = kwargs["intermediate_size"] // used
        return out

    def _token_ids(self, text: str) -> list[int]:
        """The ids of the vocabulary's tokens spelled `text` (none or one)."""
        tokens = self._meta.get("tokenizer.ggml.tokens", [])
        return [i for i, token in enumerate(tokens) if token == text]

    def _rope_scaling(self) -> dict[str, Any]:
        if "rope_freqs.weight" in self._tensor_names:
            raise ValueError("GGUF rope_freqs (Llama 3.1 rope scaling) is not supported")
        kind = self._field(f"{self.gguf_arch}.rope.scaling.type")
        if kind in (None, "none"):
            return {}
        if kind != "linear":
            raise ValueError(f"GGUF rope.scaling.type must be 'linear' or 'none', got {kind!r}")
        factor = float(self._field(f"{self.gguf_arch}.rope.scaling.factor"))
        return {"rope_scaling": {"rope_type": "linear", "factor": factor}}

    def weights(self, skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (HF name, float32 tensor) for every tensor of the file but those named in
        `skip` (kept packed), dequantized one by one.

        Raises ValueError for a tensor name this loader does not know.
        """
        from gguf.quants import dequantize

        hf_config = self.hf_config()
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        for tensor in self._tensors:
            if tensor.name in _ROPE_FACTORS:
                continue  # the config's (_phi3)
            name = hf_tensor_name(tensor.name, self.gguf_arch)
            experts = _expert_names(name, tensor)  # a stack of every expert's projection
            if name in skip or (experts and skip.issuperset(experts)):
                continue
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
            if not array.flags.writeable:  # a view of the read-only memory map
                array = array.copy()
            weight = torch.from_numpy(array)  # [out, in]
            if self.gguf_arch in _PERMUTED_QK and ".q_proj." in name:
                weight = unpermute_qk(weight, heads)
            elif self.gguf_arch in _PERMUTED_QK and ".k_proj." in name:
                weight = unpermute_qk(weight, kv_heads)
            elif self.gguf_arch == "gemma3" and name.endswith("norm.weight"):
                # llama.cpp's converter stores Gemma's norm multipliers, 1 + w: take w back.
                # GemmaRMSNorm's 1 + (v - 1) is v again, exactly for v >= 0.5 (Sterbenz), to
                # an ulp below that.
                weight = weight - 1.0
            if experts:
                yield from ((n, w) for n, w in split_experts(name, weight) or () if n not in skip)
                continue
            yield name, weight

    def packed_blocks(self) -> dict[str, tuple[str, torch.Tensor]]:
        """HF name -> (GGML type name, uint8 [out, row bytes]) for each 2-D tensor stored in a
        type the kernels multiply as stored (gguf_blocks.BLOCK_TYPES): the file's own bytes,
        rows in HF order (llama q/k unpermuted); a stack of experts [E, out, in] gives each
        expert's rows under its own name. Other tensors are left out."""
        hf_config = self.hf_config()
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        out = {}
        for tensor in self._tensors:
            if tensor.name in _ROPE_FACTORS:
                continue
            block = BY_ID.get(int(tensor.tensor_type))
            if len(tensor.shape) == 3:  # a stack of experts
                out.update(_expert_blocks(hf_tensor_name(tensor.name, self.gguf_arch), tensor))
                continue
            if block is None or len(tensor.shape) != 2:
                continue
            name = hf_tensor_name(tensor.name, self.gguf_arch)
            rows = int(tensor.shape[1])  # GGUF lists the dimensions innermost first
            blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8).reshape(rows, -1))
            if self.gguf_arch in _PERMUTED_QK and ".q_proj." in name:
                blocks = unpermute_qk(blocks, heads)
            elif self.gguf_arch in _PERMUTED_QK and ".k_proj." in name:
                blocks = unpermute_qk(blocks, kv_heads)
            out[name] = (block.name, blocks.contiguous())
        return out


def _expert_names(name: str, tensor: Any) -> list[str] | None:
    """The per-expert names of a 3-D stack of experts (GGUF dims: in, out, experts)."""
    return expert_names(name, int(tensor.shape[2])) if len(tensor.shape) == 3 else None


def _expert_blocks(name: str, tensor: Any) -> dict[str, tuple[str, torch.Tensor]]:
    """Each expert's rows of a stack the kernels multiply as stored; none (and a log line:
    those experts are dequantized to floats) for a type they don't."""
    block = BY_ID.get(int(tensor.tensor_type))
    if block is None:
        if tensor.tensor_type.name not in ("F32", "F16", "BF16"):
            logger.info("experts %s are %s, not packed: dequantized", name, tensor.tensor_type.name)
        return {}
    experts, rows = int(tensor.shape[2]), int(tensor.shape[1])
    stack = torch.from_numpy(np.array(tensor.data, dtype=np.uint8).reshape(experts, rows, -1))
    return {n: (block.name, b) for n, b in split_experts(name, stack) or ()}


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str:
    """GGUF to HF name: blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight (the
    block names of `arch`, the file's general.architecture)."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[stem]}.{suffix}"
    parts = stem.split(".")
    blocks = {"gemma3": _GEMMA_BLOCK_TENSORS, "phi3": _PHI3_BLOCK_TENSORS}.get(arch, _BLOCK_TENSORS)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in blocks:
        return f"model.layers.{parts[1]}.{blocks[parts[2]]}.{suffix}"
    raise ValueError(f"unknown GGUF tensor {gguf_name!r}")


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permutation of rows ([out, ...], out = heads * head_dim).

    llama.cpp interleaves the two rotary halves of each head (rows 0, D/2, 1, D/2+1, ...) for
    its GPT-J style rope; HF's rotate-half rope wants them back as two contiguous halves.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return w.transpose(1, 2).reshape(weight.shape)
