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
