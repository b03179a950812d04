"""Our models over ragged paged batches against transformers on the same tiny random weights."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from radixrt.attention.forward_batch import ForwardBatch
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.layers.config import TransformerConfig
from radixrt.loader.hf_config import resolve_dtype
from radixrt.loader.load import load_model
from radixrt.loader.quantize import packs_weights
from radixrt.models.registry import SUPPORTED_ARCHITECTURES, get_model_class
from radixrt.native.cpu import cpu_has_bf16

SLOTS_PER_SEQ = 64  # sequence i owns pool slots i*64 .. i*64+63


@dataclass
class Seq:
    tokens: list[int]  # the whole sequence (the test feeds it piece by piece)
    slot_base: int
    cached: int = 0  # tokens whose KV is already in the pool


def make_batch(pool: KVPool, steps: list[tuple[Seq, int]]) -> ForwardBatch:
    """A ForwardBatch feeding each (seq, n) its next n tokens after its cached ones."""
    ids, pos, loc, kv, qo, kvp, seq_lens, ext, prefix = [], [], [], [], [0], [0], [], [], []
    for seq, n in steps:
        total = seq.cached + n
        ids += seq.tokens[seq.cached : total]
        pos += range(seq.cached, total)
        loc += range(seq.slot_base + seq.cached, seq.slot_base + total)
        kv += range(seq.slot_base, seq.slot_base + total)
        qo.append(qo[-1] + n)
        kvp.append(kvp[-1] + total)
        seq_lens.append(total)
        ext.append(n)
        prefix.append(seq.cached)

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=pool.device)

    return ForwardBatch(
        input_ids=t(ids), positions=t(pos), out_cache_loc=t(loc), qo_indptr=t(qo),
        kv_indices=t(kv), kv_indptr=t(kvp), seq_lens=t(seq_lens), extend_lens=t(ext),
        seq_lens_cpu=seq_lens, extend_lens_cpu=ext, prefix_lens_cpu=prefix,
        kv_pool=pool, attn_backend=TorchAttentionBackend(),
    )  # fmt: skip


def run_step(model, pool: KVPool, steps: list[tuple[Seq, int]]) -> list[torch.Tensor]:
    """One forward; returns each sequence's logits rows [n, V] and advances its cache."""
    fb = make_batch(pool, steps)
    with torch.no_grad():
        logits = model.compute_logits(model(fb.input_ids, fb.positions, fb)).cpu()
    out, start = [], 0
    for seq, n in steps:
        out.append(logits[start : start + n])
        start += n
        seq.cached += n
    return out


def reference_logits(model_dir: str, seqs: list[Seq], dtype=torch.float32) -> list[torch.Tensor]:
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    with torch.no_grad():
        return [ref(torch.tensor([s.tokens])).logits[0].float() for s in seqs]


def check_ragged_batches(
    model_dir: str, dtype=torch.float32, atol: float = 1e-4, device: str = "cpu"
) -> None:
    """Prefill, prefill-after-cached-prefix, and decode steps in mixed batches vs transformers."""
    model, cfg = load_model(model_dir, dtype, device)
    pool = KVPool(4 * SLOTS_PER_SEQ, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, device)
    gen = torch.Generator().manual_seed(1)
    lengths = [8, 10, 11, 5]
    seqs = [
        Seq(torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist(), i * SLOTS_PER_SEQ)
        for i, n in enumerate(lengths)
    ]
    a, b, c, d = seqs
    refs = dict(zip(map(id, seqs), reference_logits(model_dir, seqs, dtype), strict=True))
    plan = [
        [(b, 5), (c, 9), (d, 3)],  # prefills, nothing cached
        [(a, 7), (c, 1), (b, 4), (d, 1)],  # prefill, decode, prefill after a prefix, decode
        [(a, 1), (b, 1), (c, 1), (d, 1)],  # decode only, different lengths
    ]
    for steps in plan:
        starts = [seq.cached for seq, _ in steps]
        for (seq, n), start, got in zip(steps, starts, run_step(model, pool, steps), strict=True):
            want = refs[id(seq)][start : start + n]
            torch.testing.assert_close(got, want, atol=atol, rtol=0)


@pytest.mark.parametrize(
    "arch, overrides",
    [
        ("llama", {}),
        ("qwen2", {}),
        ("mistral", {}),
        ("llama", {"num_hidden_layers": 3, "num_key_value_heads": 4}),  # MHA
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("llama", {"head_dim": 32}),  # heads * head_dim != hidden
        ("llama", {"tie_word_embeddings": True}),
        (
            "llama",
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 4.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
                "rope_theta": 10000.0,
            },
        ),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ],
)
def test_ragged_batch_matches_transformers(tiny_model_dir, arch, overrides):
    check_ragged_batches(tiny_model_dir(arch, **overrides))


def test_sharded_checkpoint(tiny_model_dir):
    model_dir = tiny_model_dir("qwen2", max_shard_size="40KB")
    assert (Path(model_dir) / "model.safetensors.index.json").is_file()
    assert len(list(Path(model_dir).glob("*.safetensors"))) > 2
    check_ragged_batches(model_dir)


def test_bfloat16_close_to_transformers(tiny_model_dir):
    check_ragged_batches(tiny_model_dir("llama"), dtype=torch.bfloat16, atol=0.1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch, overrides", [("qwen2", {}), ("qwen3", {"head_dim": 32})])
def test_ragged_batch_on_cuda(tiny_model_dir, arch, overrides):
    # TF32 matmuls would loosen float32; the reference runs on the CPU.
    torch.backends.cuda.matmul.allow_tf32 = False
    check_ragged_batches(tiny_model_dir(arch, **overrides), device="cuda", atol=1e-3)


def test_qwen2_has_qkv_bias_only(tiny_model_dir):
    model, _ = load_model(tiny_model_dir("qwen2"), torch.float32, "cpu")
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None
    assert attn.qkv_proj.bias.abs().sum() > 0  # loaded, not left empty


def test_tied_embeddings_share_weight(tiny_model_dir):
    model_dir = tiny_model_dir("llama", tie_word_embeddings=True)
    model, _ = load_model(model_dir, torch.float32, "cpu")
    assert model.lm_head.weight is None
    assert not any(name.startswith("lm_head") for name, _ in model.named_parameters())
    hidden = torch.randn(3, 64)
    want = hidden @ model.model.embed_tokens.weight.T
    torch.testing.assert_close(model.compute_logits(hidden), want)


def test_model_config_fields(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir("llama", head_dim=32), model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 258]}))
    model, cfg = load_model(str(model_dir), "bfloat16", "cpu")
    assert isinstance(cfg, TransformerConfig)
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (
        "LlamaForCausalLM",
        2,
        4,
        2,
    )
    assert (cfg.head_dim, cfg.hidden_size, cfg.vocab_size, cfg.max_position_embeddings) == (
        32,
        64,
        320,
        512,
    )
    assert cfg.eos_token_ids == [258, 7]
    assert cfg.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert resolve_dtype("auto", "cpu") == (torch.bfloat16 if cpu_has_bf16() else torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("float64")


def test_auto_dtype_is_bfloat16_for_packed_weights_on_any_cpu_with_the_kernels(monkeypatch):
    from radixrt.layers.quantized import native_ops_loaded
    from radixrt.native.cpu import ISA_ENV

    if not native_ops_loaded():
        pytest.skip("radixrt's native CPU ops did not build (no compiler?)")
    monkeypatch.setenv(ISA_ENV, "avx2")  # a CPU without bf16 matmul units
    assert resolve_dtype("auto", "cpu") == torch.float32  # a dense model's matmuls
    assert resolve_dtype("auto", "cpu", packed=True) == torch.bfloat16  # int8 rows, see docs
    assert resolve_dtype("float32", "cpu", packed=True) == torch.float32


def test_packs_weights_says_before_loading_whether_layers_will_be_packed():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    gguf, folder = Path("model.gguf"), Path("hf-folder")
    assert packs_weights("auto", gguf, cpu, 1)
    assert not packs_weights("auto", folder, cpu, 1)  # a safetensors checkpoint stays dense
    assert not packs_weights("auto", gguf, cpu, 2)  # ranks keep dense shards
    assert not packs_weights("auto", gguf, cuda, 1)
    assert packs_weights("int4", folder, cpu, 1) and packs_weights("int8", folder, cpu, 2)
    assert not packs_weights("none", gguf, cpu, 1)


def test_unknown_architecture(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir("llama"), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["FooForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="FooForCausalLM") as err:
        load_model(str(model_dir), torch.float32, "cpu")
    assert all(name in str(err.value) for name in SUPPORTED_ARCHITECTURES)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        get_model_class("GPT2LMHeadModel")


def test_missing_files(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(str(tmp_path / "nowhere"), torch.float32, "cpu")
    no_config = tmp_path / "no_config"
    shutil.copytree(tiny_model_dir("llama"), no_config)
    (no_config / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(no_config), torch.float32, "cpu")
    no_weights = tmp_path / "no_weights"
    shutil.copytree(tiny_model_dir("llama"), no_weights)
    for f in no_weights.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="no_weights"):
        load_model(str(no_weights), torch.float32, "cpu")


def test_missing_weight_names_parameter(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir("llama"), model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(str(model_dir), torch.float32, "cpu")


@pytest.mark.parametrize(
    "arch, overrides, field",
    [
        ("llama", {"hidden_act": "gelu"}, "hidden_act"),
        ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_type"),
        ("mistral", {"sliding_window": 64}, "sliding_window"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 64}, "sliding_window"),
        ("llama", {"num_key_value_heads": 3}, "num_key_value_heads"),
        ("qwen3", {"use_sliding_window": True, "sliding_window": 64}, "sliding_window"),
    ],
)
def test_unsupported_config_raises(make_tiny_config, arch, overrides, field):
    config = make_tiny_config(arch, **overrides)
    with pytest.raises(ValueError, match=field):
        get_model_class(_ARCH[arch]).config_from_hf(config)


_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def test_tiny_tokenizer(tiny_model_dir):
    from radixrt.loader.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_model_dir("llama"))
    assert tok.eos_token_id == 258 and len(tok) == 320
    ids = tok.encode("héllo", add_special_tokens=False)
    assert len(ids) == 6 and tok.decode(ids) == "héllo"  # one token per byte
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(FileNotFoundError):
        load_tokenizer("/nonexistent/model")
