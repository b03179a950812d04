"""Writing tiny models as GGUF files the way llama.cpp's convert_hf_to_gguf.py does, for the
loader's tests: the shape keys every architecture's file carries, and the closing writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def shape_keys(writer: Any, hf: Any, head_dim: bool = True) -> None:
    """Layers, context, widths, heads (and, with `head_dim`, the key and value lengths), the
    norms' epsilon, the vocabulary size and the EOS id of transformers config `hf`."""
    writer.add_block_count(hf.num_hidden_layers)
    writer.add_context_length(hf.max_position_embeddings)
    writer.add_embedding_length(hf.hidden_size)
    writer.add_feed_forward_length(hf.intermediate_size)
    writer.add_head_count(hf.num_attention_heads)
    writer.add_head_count_kv(hf.num_key_value_heads)
    if head_dim:
        writer.add_key_length(hf.head_dim)
        writer.add_value_length(hf.head_dim)
    writer.add_layer_norm_rms_eps(hf.rms_norm_eps)
    writer.add_vocab_size(hf.vocab_size)
    writer.add_eos_token_id(hf.eos_token_id)


def finish(writer: Any, out: Path) -> Path:
    """Header, entries and tensors to the file; its path."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def read_as_the_model(config: Any, architecture: str) -> Any:
    """A config, ours (loader/gguf_config.py) or transformers', as `architecture`'s model reads
    it: its TransformerConfig. The two spell the rope differently (rope_theta and rope_scaling
    against transformers 5's rope_parameters); what the layers get must be the same."""
    from radixrt.models.registry import get_model_class

    return get_model_class(architecture).config_from_hf(config)


def assert_read_alike(ours: Any, theirs: Any, architecture: str) -> None:
    """`read_as_the_model` equal for both, the norms' epsilon to float32's precision (a GGUF
    file stores it as a float32; a folder's config.json as written)."""
    import dataclasses

    import pytest

    mine, want = read_as_the_model(ours, architecture), read_as_the_model(theirs, architecture)
    assert mine.rms_norm_eps == pytest.approx(want.rms_norm_eps, rel=1e-6)
    assert dataclasses.replace(mine, rms_norm_eps=want.rms_norm_eps) == want
