"""Tensor-parallel layers and sharded loading on two real gloo ranks, in float32.

Every check runs in one spawn of two ranks (a spawn costs seconds): each rank builds the sharded
layer or model, and the parent compares what the ranks computed with the unsharded result.
Float32 sums taken in another order (an all-reduce of two partial products instead of one
matmul) differ by rounding only: ATOL and RTOL bound that, far below what a wrong shard would give.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from radixrt.attention.forward_batch import ForwardBatch
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.distributed import TPGroup, init_tp_group
from radixrt.layers.attention import AttentionShape, RotaryAttention
from radixrt.layers.config import RopeConfig
from radixrt.layers.embedding import LMHead, VocabParallelEmbedding
from radixrt.layers.linear import MergedLinear, RowParallelLinear
from radixrt.layers.rotary import RotaryEmbedding
from radixrt.loader.load import load_model
from radixrt.models.weight_loader import checkpoint_targets, load_hf_weights

# Float32 reduction-order differences (relative ~1e-7 per sum; the random layers' outputs reach
# ~100): a wrong shard is off by far more than these.
ATOL, RTOL = 1e-5, 1e-5
ODD_VOCAB = 321  # not divisible by the 2 ranks: padded to 322, 161 rows each
PROMPTS = [[5, 17, 300, 42, 7, 99, 250], [1, 2, 3]]
DECODE_STEPS = 4

# name -> (arch, config overrides); written by the parent, read by the ranks (a path argument).
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    # KV heads (1) fewer than ranks: replicated; vocabulary padded; biases on q/k/v and o.
    "llama": ("llama", {"num_key_value_heads": 1, "vocab_size": ODD_VOCAB, "attention_bias": True}),
    # KV heads split (2 over 2 ranks), tied embeddings, q/k/v biases.
    "qwen2": ("qwen2", {"tie_word_embeddings": True}),
    # The same folder's weights as a GGUF file: each tensor dequantized, then sliced.
    "qwen3-gguf": ("qwen3", {"head_dim": 16}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_checkpoint(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Random HF-named full tensors for an unsharded module, the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, target in checkpoint_targets(module).items():
        dst = target.param
        if target.merged is not None:
            dst = target.merged.shard(target.shard, dst)
        out[name] = torch.randn(dst.shape, generator=gen)
    return out


def loaded(module: torch.nn.Module, checkpoint: dict[str, torch.Tensor]) -> torch.nn.Module:
    load_hf_weights(module, checkpoint.items(), lambda name: False)
    return module.eval().requires_grad_(False)


def one_sequence_batch(n: int, num_kv_heads: int, head_dim: int) -> ForwardBatch:
    ar = torch.arange(n)
    batch = ForwardBatch(
        input_ids=ar, positions=ar, out_cache_loc=ar, qo_indptr=torch.tensor([0, n]),
        kv_indices=ar, kv_indptr=torch.tensor([0, n]), seq_lens=torch.tensor([n]),
        extend_lens=torch.tensor([n]), seq_lens_cpu=[n], extend_lens_cpu=[n], prefix_lens_cpu=[0],
        kv_pool=KVPool(n, 1, num_kv_heads, head_dim, torch.float32, "cpu"),
        attn_backend=TorchAttentionBackend(),
    )  # fmt: skip
    batch.attn_backend.init_forward_metadata(batch)
    return batch


def layer_outputs(group: TPGroup) -> dict[str, Any]:
    """Each layer's output on this rank (the unsharded layer when group is single)."""
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(7))
    out: dict[str, Any] = {}
    column = MergedLinear.column_parallel(32, [24, 16], ["a_proj", "b_proj"], True, group)
    full = MergedLinear(32, [24, 16], ["a_proj", "b_proj"], True)
    out["column"] = loaded(column, random_checkpoint(full, 1))(x)

    row = RowParallelLinear(32, 8, True, group)
    row_input = x.chunk(group.size, dim=1)[group.rank]  # what a column-parallel layer hands on
    out["row"] = loaded(row, random_checkpoint(torch.nn.Linear(32, 8), 2))(row_input)

    embed = loaded(VocabParallelEmbedding(ODD_VOCAB, 32, group), random_checkpoint(
        VocabParallelEmbedding(ODD_VOCAB, 32), 3
    ))  # fmt: skip
    ids = torch.tensor([0, 160, 161, 162, 320, 5, 161])  # both sides of the ranks' boundary
    out["embedding"] = embed(ids)
    head = LMHead(32, ODD_VOCAB, tied=False, group=group)
    out["lm_head"] = loaded(head, random_checkpoint(LMHead(32, ODD_VOCAB, False), 4))(x, embed)
    out["lm_head_tied"] = LMHead(32, ODD_VOCAB, tied=True, group=group)(x, embed)

    shape = AttentionShape(
        hidden_size=32, num_heads=4, num_kv_heads=1, head_dim=8, qkv_bias=True, o_bias=True
    )
    attn = RotaryAttention(0, shape, group)
    loaded(attn, random_checkpoint(RotaryAttention(0, shape), 5))
    cos, sin = RotaryEmbedding(8, RopeConfig()).cos_sin(torch.arange(6), torch.float32)
    out["attention"] = attn(x, cos, sin, one_sequence_batch(6, attn.num_kv_heads, 8))
    out["attention_local_heads"] = (attn.num_heads, attn.num_kv_heads)
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def greedy_run(model: Any) -> tuple[list[list[list[float]]], list[list[int]]]:
    """Prefill both PROMPTS in one batch, then DECODE_STEPS greedy steps of both through the
    paged KV pool: each step's last-token logits and the greedy tokens."""
    head_dim = model.config.head_dim
    pool = KVPool(64, model.config.num_layers, model.num_local_kv_heads, head_dim,
                  torch.float32, "cpu")  # fmt: skip
    seqs = [list(p) for p in PROMPTS]
    cached = [0, 0]
    steps_logits, tokens = [], [[] for _ in seqs]
    for _ in range(DECODE_STEPS + 1):
        fb = _batch(pool, seqs, cached)
        with torch.no_grad():
            hidden = model(fb.input_ids, fb.positions, fb)
            last_rows = torch.tensor(fb.qo_indptr[1:].tolist()) - 1
            logits = model.compute_logits(hidden[last_rows])
        steps_logits.append(logits.tolist())
        for i, token in enumerate(logits.argmax(-1).tolist()):
            cached[i] = len(seqs[i])
            seqs[i].append(token)
            tokens[i].append(token)
    return steps_logits, tokens


def _batch(pool: KVPool, seqs: list[list[int]], cached: list[int]) -> ForwardBatch:
    # Sequence i owns pool slots 32*i ..; feeds its tokens after the cached ones.
    ids, pos, loc, kv, qo, kvp, lens, ext = [], [], [], [], [0], [0], [], []
    for i, (seq, done) in enumerate(zip(seqs, cached, strict=True)):
        n, base = len(seq) - done, 32 * i
        ids += seq[done:]
        pos += range(done, len(seq))
        loc += range(base + done, base + len(seq))
        kv += range(base, base + len(seq))
        qo.append(qo[-1] + n)
        kvp.append(kvp[-1] + len(seq))
        lens.append(len(seq))
        ext.append(n)
    t = torch.tensor
    return ForwardBatch(
        input_ids=t(ids), positions=t(pos), out_cache_loc=t(loc), qo_indptr=t(qo),
        kv_indices=t(kv), kv_indptr=t(kvp), seq_lens=t(lens), extend_lens=t(ext),
        seq_lens_cpu=lens, extend_lens_cpu=ext, prefix_lens_cpu=list(cached),
        kv_pool=pool, attn_backend=TorchAttentionBackend(),
    )  # fmt: skip


class CountingSafeOpen:
    """safetensors.safe_open that counts the elements read through get_slice and refuses
    get_tensor (a whole tensor): proof that a rank reads only its slices."""

    def __init__(self, real: Any, counter: list[int]) -> None:
        self.real, self.counter = real, counter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        counter, handle = self.counter, self.real(*args, **kwargs)

        class Handle:
            def __enter__(self) -> Handle:
                self.f = handle.__enter__()
                return self

            def __exit__(self, *exc: Any) -> None:
                handle.__exit__(*exc)

            def keys(self) -> Any:
                return self.f.keys()

            def get_tensor(self, name: str) -> Any:
                raise AssertionError(f"a sharded rank read the whole tensor {name}")

            def get_slice(self, name: str) -> Any:
                real_slice = self.f.get_slice(name)

                class Slice:
                    def get_shape(self) -> Any:
                        return real_slice.get_shape()

                    def __getitem__(self, index: Any) -> Any:
                        tensor = real_slice[index]
                        counter[0] += tensor.numel()
                        return tensor

                return Slice()

        return Handle()


def model_results(group: TPGroup, model_dir: str) -> dict[str, Any]:
    import radixrt.loader.weights as weights

    counter = [0]
    weights.safe_open = CountingSafeOpen(weights.safe_open, counter)  # this rank process only
    model, _ = load_model(model_dir, torch.float32, "cpu", group)
    params = dict(model.named_parameters())
    steps_logits, tokens = greedy_run(model)
    return {
        "elements_read": counter[0],
        "num_local_kv_heads": model.num_local_kv_heads,
        "params": {name: p.tolist() for name, p in params.items() if _checked(name)},
        "logits": steps_logits,
        "tokens": tokens,
    }


def _checked(name: str) -> bool:
    # The parameters whose slicing the parent checks against the checkpoint.
    layer0 = "model.layers.0."
    wanted = ("self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias", "self_attn.o_proj.weight",
              "mlp.gate_up_proj.weight", "mlp.down_proj.weight")  # fmt: skip
    return name in ("model.embed_tokens.weight", "lm_head.weight") or any(
        name == layer0 + w for w in wanted
    )


def _rank(rank: int, port: int, model_dirs: dict[str, str], out: dict) -> None:
    torch.manual_seed(0)
    group = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", "cpu", timeout_s=60)
    result = {"layers": layer_outputs(group)}
    for name, model_path in model_dirs.items():
        result[name] = model_results(group, model_path)
    out[rank] = result


@pytest.fixture(scope="module")
def folders(tiny_model_dir) -> dict[str, str]:
    """Each model's safetensors folder (the GGUF model's: what its file was written from)."""
    return {name: tiny_model_dir(arch, **overrides) for name, (arch, overrides) in MODELS.items()}


@pytest.fixture(scope="module")
def model_dirs(folders, tmp_path_factory) -> dict[str, str]:
    """What the ranks load: the folder, or the GGUF file written from it."""
    from unit.test_gguf_loader import write_gguf  # tests/ is on sys.path (its conftest)

    gguf_file = tmp_path_factory.mktemp("gguf") / "qwen3.gguf"
    return {**folders, "qwen3-gguf": str(write_gguf(folders["qwen3-gguf"], gguf_file))}


@pytest.fixture(scope="module")
def ranks(model_dirs) -> dict[int, dict[str, Any]]:
    with mp.Manager() as manager:
        out = manager.dict()
        ctx = mp.get_context("spawn")
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, port, model_dirs, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert not p.is_alive(), "a rank hung"
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        return dict(out)


@pytest.fixture(scope="module")
def single() -> dict[str, Any]:
    torch.manual_seed(0)
    return layer_outputs(TPGroup.single())


def close(got: Any, want: Any) -> None:
    torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(want), atol=ATOL, rtol=RTOL)


def test_column_parallel_holds_each_projections_rows(ranks, single):
    a, b = torch.tensor(single["column"]).split([24, 16], dim=1)
    for rank in (0, 1):
        want = torch.cat((a.chunk(2, 1)[rank], b.chunk(2, 1)[rank]), dim=1)
        close(ranks[rank]["layers"]["column"], want)


def test_row_parallel_sums_the_ranks_and_adds_the_bias_once(ranks, single):
    for rank in (0, 1):
        close(ranks[rank]["layers"]["row"], single["row"])


@pytest.mark.parametrize("layer", ["embedding", "lm_head", "lm_head_tied"])
def test_vocab_parallel_layers_with_a_padded_vocabulary(ranks, single, layer):
    assert torch.tensor(single[layer]).shape[-1] in (32, ODD_VOCAB)
    for rank in (0, 1):
        close(ranks[rank]["layers"][layer], single[layer])


def test_attention_with_fewer_kv_heads_than_ranks(ranks, single):
    for rank in (0, 1):
        assert ranks[rank]["layers"]["attention_local_heads"] == (2, 1)
        close(ranks[rank]["layers"]["attention"], single["attention"])


def test_heads_the_ranks_do_not_divide_name_tp_size():
    shape = AttentionShape(
        hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=False, o_bias=False
    )
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\).*--tp-size \(3\)"):
        RotaryAttention(0, shape, TPGroup(0, 3, torch.device("cpu")))


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_tp2_model_equals_tp1(ranks, model_dirs, arch):
    # The reference is the unsharded model from the same file (GGUF: it equals the folder's).
    model, _ = load_model(model_dirs[arch], torch.float32, "cpu")
    want_logits, want_tokens = greedy_run(model)
    for rank in (0, 1):
        got = ranks[rank][arch]
        assert got["tokens"] == want_tokens
        for step, (got_step, want_step) in enumerate(zip(got["logits"], want_logits, strict=True)):
            assert torch.tensor(got_step).shape == (len(PROMPTS), model.config.vocab_size), step
            close(got_step, want_step)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_each_rank_loads_exactly_its_slice(ranks, folders, arch):
    full = load_file(f"{folders[arch]}/model.safetensors")
    cfg = load_model(folders[arch], torch.float32, "cpu")[0].config
    if cfg.tie_word_embeddings:  # a copy some checkpoints carry; the loader skips it unread
        full.pop("lm_head.weight", None)
    for rank in (0, 1):
        got = ranks[rank][arch]["params"]
        want = expected_shards(full, cfg, rank)
        assert set(got) == set(want)
        for name, tensor in want.items():
            assert torch.equal(torch.tensor(got[name]), tensor), (rank, name)
        assert ranks[rank][arch]["num_local_kv_heads"] == max(1, cfg.num_kv_heads // 2)
    if arch.endswith("gguf"):
        return  # GGUF tensors are read whole (to dequantize them), then sliced
    # Every element of the checkpoint once, plus the replicated ones (norms, biases of the
    # row-parallel layers, KV heads shared by ranks) once per extra rank: nothing else.
    total_read = sum(ranks[rank][arch]["elements_read"] for rank in (0, 1))
    replicated = sum(t.numel() for n, t in full.items() if _replicated(n, cfg.num_kv_heads))
    assert total_read == sum(t.numel() for t in full.values()) + replicated


def expected_shards(full: dict[str, torch.Tensor], cfg: Any, rank: int) -> dict[str, Any]:
    """Rank `rank` of 2's parameters (the _checked ones), sliced from the checkpoint by hand."""
    d, attn, mlp = cfg.head_dim, "model.layers.0.self_attn.", "model.layers.0.mlp."
    q_heads, kv_heads = cfg.num_heads // 2, max(1, cfg.num_kv_heads // 2)
    first_kv = rank * cfg.num_kv_heads // 2  # with 1 KV head, both ranks hold head 0
    rows = {"q_proj": slice(rank * q_heads * d, (rank + 1) * q_heads * d)}
    rows["k_proj"] = rows["v_proj"] = slice(first_kv * d, (first_kv + kv_heads) * d)
    half = cfg.intermediate_size // 2
    ff = slice(rank * half, (rank + 1) * half)
    want = {
        attn + "qkv_proj.weight": torch.cat(
            [full[f"{attn}{p}.weight"][r] for p, r in rows.items()]
        ),
        attn + "o_proj.weight": full[attn + "o_proj.weight"][:, rows["q_proj"]],
        mlp + "gate_up_proj.weight": torch.cat(
            (full[mlp + "gate_proj.weight"][ff], full[mlp + "up_proj.weight"][ff])
        ),
        mlp + "down_proj.weight": full[mlp + "down_proj.weight"][:, ff],
    }
    if cfg.qkv_bias:
        want[attn + "qkv_proj.bias"] = torch.cat(
            [full[f"{attn}{p}.bias"][r] for p, r in rows.items()]
        )
    vocab_rows = -(-cfg.vocab_size // 2)  # padded to 2 * vocab_rows, zeros past the end
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in full:
            part = full[name][rank * vocab_rows : (rank + 1) * vocab_rows]
            want[name] = torch.cat((part, torch.zeros(vocab_rows - len(part), cfg.hidden_size)))
    return want


def _replicated(name: str, num_kv_heads: int) -> bool:
    if "norm" in name or name.endswith(("o_proj.bias", "down_proj.bias")):
        return True
    return num_kv_heads < 2 and (".k_proj." in name or ".v_proj." in name)
