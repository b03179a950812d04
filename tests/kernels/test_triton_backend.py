"""The `triton` attention backend, on CPU tensors under the interpreter or compiled on a GPU
(tests/kernels/triton_device.py): against the torch backend on mixed batches, and end to end
in the engine (same greedy tokens as `torch`; on a GPU with CUDA graphs, the triton default)."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the `test` extra installs it)")

from triton_device import KERNEL_DEVICE, interpreter_only, on_kernel_device  # noqa: E402

import radixrt  # noqa: E402
from radixrt.attention import triton_backend  # noqa: E402
from radixrt.attention.base import create_backend  # noqa: E402
from radixrt.attention.forward_batch import ForwardBatch  # noqa: E402
from radixrt.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from radixrt.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from radixrt.cache.kv_pool import KVPool  # noqa: E402
from radixrt.kernels.decode_attention import decode_attention  # noqa: E402
from radixrt.kernels.reference import paged_attention_ref  # noqa: E402

HQ, HKV, D = 6, 2, 64


def batch_on_pages(
    pool: KVPool, specs: list[tuple[int, int]], page_size: int, gen: torch.Generator
) -> ForwardBatch:
    """specs: (prefix, new) per sequence, each on its own shuffled pages; the prefixes' K/V are
    written into the pool here."""
    pages = torch.randperm(pool.size // page_size, generator=gen).tolist()
    kv, loc, used = [], [], 0
    for prefix, n in specs:
        count = -(-(prefix + n) // page_size)
        mine = pages[used : used + count]
        used += count
        slots = [p * page_size + j for p in mine for j in range(page_size)][: prefix + n]
        for layer in range(pool.num_layers):
            pool.set_kv(
                layer,
                torch.tensor(slots[:prefix], dtype=torch.int64, device=KERNEL_DEVICE),
                torch.randn(prefix, HKV, D, generator=gen).to(KERNEL_DEVICE),
                torch.randn(prefix, HKV, D, generator=gen).to(KERNEL_DEVICE),
            )
        kv += slots
        loc += slots[prefix:]
    news, lens = [n for _, n in specs], [p + n for p, n in specs]

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64, device=KERNEL_DEVICE)

    def indptr(x: list[int]) -> torch.Tensor:
        return t([0] + x).cumsum(0)

    return ForwardBatch(
        input_ids=t([0] * sum(news)), positions=t(sum((list(range(p, p + n)) for p, n in specs),
                                                      [])),
        out_cache_loc=t(loc), qo_indptr=indptr(news), kv_indices=t(kv), kv_indptr=indptr(lens),
        seq_lens=t(lens), extend_lens=t(news), seq_lens_cpu=lens, extend_lens_cpu=news,
        prefix_lens_cpu=[p for p, _ in specs], kv_pool=pool, attn_backend=None,
    )  # fmt: skip


@on_kernel_device
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("specs", [
    [(0, 1), (20, 1), (37, 1)],  # decode only, ragged: the split-KV kernel
    [(21, 5), (0, 7), (9, 1), (0, 1)],  # prefill after a mid-page prefix, plain prefill, decode
])  # fmt: skip
def test_matches_torch_backend(specs, page_size):
    gen = torch.Generator().manual_seed(0)
    pools = [KVPool(256, 2, HKV, D, torch.float32, KERNEL_DEVICE) for _ in range(2)]
    batches = [
        batch_on_pages(pool, specs, page_size, torch.Generator().manual_seed(1)) for pool in pools
    ]
    backends = [TorchAttentionBackend(), TritonAttentionBackend(device=KERNEL_DEVICE)]
    n = batches[0].qo_indptr[-1].item()
    q, k, v = (torch.randn(n, h, D, generator=gen).to(KERNEL_DEVICE) for h in (HQ, HKV, HKV))
    for fb, backend in zip(batches, backends, strict=True):
        fb.attn_backend = backend
        backend.init_forward_metadata(fb)
    for layer in range(2):
        want, got = (
            be.forward(q, k, v, layer, fb, D**-0.5)
            for be, fb in zip(backends, batches, strict=True)
        )
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pools[1].get_kv(layer), pools[0].get_kv(layer))


def windowed_forward(specs, windows: list[int], graph: bool = False) -> None:
    """backend.forward on one layer per window, each against the reference over the pool."""
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(256, len(windows), HKV, D, torch.float32, KERNEL_DEVICE)
    fb = batch_on_pages(pool, specs, 16, torch.Generator().manual_seed(1))
    fb.attn_backend = backend = TritonAttentionBackend(device=KERNEL_DEVICE)
    (backend.init_graph_metadata if graph else backend.init_forward_metadata)(fb)
    n = fb.qo_indptr[-1].item()
    q, k, v = (torch.randn(n, h, D, generator=gen).to(KERNEL_DEVICE) for h in (HQ, HKV, HKV))
    for layer, window in enumerate(windows):
        got = backend.forward(q, k, v, layer, fb, D**-0.5, window=window)
        k_buffer, v_buffer = pool.get_kv(layer)
        want = paged_attention_ref(
            q, k_buffer, v_buffer, fb.qo_indptr, fb.kv_indptr, fb.kv_indices, D**-0.5, window
        )
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@on_kernel_device
@pytest.mark.parametrize("window", [1, 8])
@pytest.mark.parametrize("specs", [
    [(0, 1), (20, 1), (7, 1)],  # decode only: lengths 1, 21 and 8 (below, past and at 8)
    [(40, 3), (0, 7), (9, 1)],  # a cached prefix wholly before the window, prefill, decode
])  # fmt: skip
def test_sliding_window_matches_reference(specs, window):
    windowed_forward(specs, [window])


@on_kernel_device
def test_sliding_window_under_graph_metadata(monkeypatch):
    """Captured metadata knows no length: a windowed layer's split count comes from the batch
    and the window alone (fewer than a full layer's for a short window), and is still right."""
    splits = []

    def spy(*args, **kwargs):
        splits.append(args[6])
        return decode_attention(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "decode_attention", spy)
    windowed_forward([(30, 1), (3, 1)], [0, 8], graph=True)
    assert splits[1] < splits[0]


@interpreter_only
def test_refuses_the_cpu_without_the_interpreter(monkeypatch):
    assert isinstance(create_backend("triton", device="cpu"), TritonAttentionBackend)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        create_backend("triton", device="cpu")


MAX_NEW = 8


def prompts(vocab: int) -> list[list[int]]:
    """A ragged batch (3 to 40 tokens) and two prompts sharing a 45-token prefix."""
    rng = random.Random(0)

    def rand(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    prefix = rand(45)
    return [rand(n) for n in (3, 17, 40)] + [prefix + rand(4), prefix + rand(9)]


def greedy(path: str, backend: str, **settings) -> list[list[int]]:
    params = {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
    with radixrt.Engine(
        model_path=path,
        dtype="float32",
        device=KERNEL_DEVICE,
        in_process=True,
        skip_tokenizer_init=True,
        attention_backend=backend,
        enable_kv_checks=True,
        max_total_tokens=1024,
        **settings,
    ) as engine:
        batch = prompts(engine.info.vocab_size)
        outs = [o["output_ids"] for o in engine.generate(input_ids=batch, sampling_params=params)]
        # The shared-prefix prompt again: now a radix-cache hit, its prefix read from the pool.
        again = engine.generate(input_ids=batch[-1], sampling_params=params)
        ps = engine.server_args.page_size
        assert again["meta_info"]["cached_tokens"] == (len(batch[-1]) - 1) // ps * ps
        engine.get_stats(check_kv=True)
    return outs + [again["output_ids"]]


@on_kernel_device
@pytest.mark.parametrize(
    "settings",
    [
        dict(page_size=1),
        # Chunks of 7: prefill chunks and decode steps share batches (the extend kernel's mix).
        dict(page_size=16, chunked_prefill_size=7),
    ],
    ids=["page1", "page16-chunked"],
)
def test_engine_greedy_equals_torch_backend(tiny_model_dir, settings):
    path = tiny_model_dir("llama", num_attention_heads=6, num_key_value_heads=2, hidden_size=96)
    assert greedy(path, "triton", **settings) == greedy(path, "torch", **settings)


@on_kernel_device
def test_gemma3_greedy_equals_torch_backend(tiny_model_dir):
    """Sliding-window and global layers (a window of 7, shorter than every prompt), chunked:
    the windowed extend and decode kernels inside a real model."""
    path = tiny_model_dir("gemma3")
    settings = dict(page_size=16, chunked_prefill_size=7)
    assert greedy(path, "triton", **settings) == greedy(path, "torch", **settings)


def _forward_row0(specs, deterministic=True, graph=False, context_length=None) -> torch.Tensor:
    """The first sequence's output rows, its K/V, pages and new token the same whatever the
    others are (batch_on_pages draws the first sequence's first)."""
    pool = KVPool(1024, 1, HKV, D, torch.float32, KERNEL_DEVICE)
    fb = batch_on_pages(pool, specs, 16, torch.Generator().manual_seed(1))
    fb.attn_backend = backend = TritonAttentionBackend(
        device=KERNEL_DEVICE, deterministic=deterministic, context_length=context_length
    )
    (backend.init_graph_metadata if graph else backend.init_forward_metadata)(fb)
    mine = torch.Generator().manual_seed(0)
    others = torch.Generator().manual_seed(2)
    n0, rest = specs[0][1], sum(n for _, n in specs[1:])
    q, k, v = (
        torch.cat(
            [torch.randn(n0, h, D, generator=mine), torch.randn(rest, h, D, generator=others)]
        )
        for h in (HQ, HKV, HKV)
    )
    out = backend.forward(*(x.to(KERNEL_DEVICE) for x in (q, k, v)), 0, fb, D**-0.5)
    return out[:n0]


@on_kernel_device
def test_deterministic_decode_row_is_the_same_in_any_batch():
    """With the flag a decode step of 300 keys (two chunks of 256) gives the same bits alone
    (the decode kernels), in a mixed batch (the extend kernel), beside a longer decode, and
    under CUDA-graph metadata with and without the context length; without it the split
    count follows the batch and the bits move."""
    alone = _forward_row0([(299, 1)])
    assert torch.equal(_forward_row0([(299, 1), (21, 5), (0, 7)]), alone)
    assert torch.equal(_forward_row0([(299, 1), (600, 1)]), alone)
    for context_length in (1024, None):
        assert torch.equal(_forward_row0([(299, 1), (3, 1)], True, True, context_length), alone)
    # The default kernels: 2 splits alone on the CPU's stand-in 2 SMs, 1 in a batch of 4.
    batches = ([(299, 1)], [(299, 1)] + [(9, 1)] * 3)
    default = [_forward_row0(specs, deterministic=False) for specs in batches]
    assert not torch.equal(default[0], default[1])
