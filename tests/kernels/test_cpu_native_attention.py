"""radixrt::paged_attention (native/csrc/paged_attention.cpp) against softmax(QK^T)V in float64.

Tolerances: float32 inputs 2e-5 absolute on outputs of size ~1 (the kernel accumulates in
float32, its exp is accurate to ~2e-7); bfloat16 inputs 1e-2 on the output (it is rounded to
bfloat16, 2^-8 relative) and 1e-4 on the float32 log-sum-exp.
"""

from __future__ import annotations

import pytest
import torch

from radixrt.attention.forward_batch import ForwardBatch
from radixrt.attention.torch_backend import TorchAttentionBackend
from radixrt.cache.kv_pool import KVPool
from radixrt.native import build as native

CPU = "cpu"  # the native kernels run on CPU tensors, whatever TRITON_INTERPRET says
OPS = native.load_native()
needs_native = pytest.mark.skipif(
    OPS is None, reason="native CPU kernels unavailable (no compiler/ninja, or disabled)"
)
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (1e-2, 1e-4)}  # (out, lse)


def reference(kv, scale: float, window: int = 0):
    """Per sequence: new token t of n sits at position L - n + t and sees keys 0..L - n + t
    (with a sliding window W > 0, only those after L - n + t - W)."""
    hq, hkv = kv.q.shape[1], kv.k_buffer.shape[1]
    out = torch.empty(kv.q.shape, dtype=torch.float64)
    lse = torch.empty(kv.q.shape[:2], dtype=torch.float64)
    qo, kvp = kv.qo_indptr.tolist(), kv.kv_indptr.tolist()
    for b in range(len(qo) - 1):
        n, length = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b]
        slots = kv.kv_indices[kvp[b] : kvp[b + 1]]
        k = kv.k_buffer[slots].double().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        v = kv.v_buffer[slots].double().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        q = kv.q[qo[b] : qo[b + 1]].double().transpose(0, 1)  # [Hq, n, D]
        scores = q @ k.transpose(1, 2) * scale
        keys, q_pos = torch.arange(length)[None, :], torch.arange(length - n, length)[:, None]
        visible = keys <= q_pos
        if window:
            visible &= keys > q_pos - window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[qo[b] : qo[b + 1]] = (torch.softmax(scores, -1) @ v).transpose(0, 1)
        lse[qo[b] : qo[b + 1]] = torch.logsumexp(scores, -1).transpose(0, 1)
    return out, lse


def random_specs(gen: torch.Generator, count: int, max_new: int) -> list[tuple[int, int]]:
    """(prefix, new) pairs: lengths 1..300, decodes, short extends and longer chunks mixed."""
    specs = []
    for i in range(count):
        new = [1, 1, 3, max_new][i % 4]
        total = int(torch.randint(new, 301, (), generator=gen))
        specs.append((total - new, new))
    return specs


def check(kv, dtype: torch.dtype, window: int = 0) -> None:
    scale = kv.q.shape[-1] ** -0.5
    out, lse = OPS.paged_attention(
        kv.q, kv.k_buffer, kv.v_buffer, kv.qo_indptr, kv.kv_indptr, kv.kv_indices, scale, window,
        [], [],
    )  # fmt: skip
    ref_out, ref_lse = reference(kv, scale, window)
    out_tol, lse_tol = TOLERANCE[dtype]
    assert out.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, atol=out_tol, rtol=0)
    torch.testing.assert_close(lse.double(), ref_lse, atol=lse_tol, rtol=0)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 80, 128])  # 80: not a multiple of the 6 or 12 chains
@pytest.mark.parametrize("hq,hkv", [(4, 4), (9, 3), (8, 2)])  # GQA groups 1, 3, 4
def test_ragged_batch_matches_float64_reference(paged_kv, dtype, head_dim, hq, hkv):
    gen = torch.Generator().manual_seed(hq * head_dim)
    specs = random_specs(gen, count=7, max_new=40)
    kv = paged_kv(specs, hq, hkv, head_dim, page_size=16, dtype=dtype, seed=hkv, device=CPU)
    check(kv, dtype)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 5, 64, 100, 299, 4096])
@pytest.mark.parametrize(
    "head_dim,hq,hkv",
    [(256, 4, 1), (64, 9, 3), (128, 2, 2)],  # Gemma 3 270M's first
)
def test_sliding_window_matches_float64_reference(paged_kv, dtype, window, head_dim, hq, hkv):
    """Decodes (past and within the window), short extends and chunks of up to 120 tokens
    (bands that cut through a tile's rows) after prefixes of up to 300."""
    gen = torch.Generator().manual_seed(window + head_dim)
    specs = [*random_specs(gen, count=6, max_new=120), (0, 130), (280, 1)]
    kv = paged_kv(specs, hq, hkv, head_dim, page_size=16, dtype=dtype, seed=window, device=CPU)
    check(kv, dtype, window)


@needs_native
def test_window_refuses_a_negative_width(paged_kv):
    kv = paged_kv([(3, 1)], 2, 2, 64, page_size=1, dtype=torch.float32, seed=0, device=CPU)
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        OPS.paged_attention(
            kv.q, kv.k_buffer, kv.v_buffer, kv.qo_indptr, kv.kv_indptr, kv.kv_indices, 0.1, -1,
            [], [],
        )  # fmt: skip


@needs_native
def test_prefill_without_prefix_and_a_wide_group(paged_kv):
    """A long causal chunk with no cached keys, and 40 query heads per kv head (tiles split
    the group's heads), on single-slot pages."""
    check(paged_kv([(0, 300), (5, 1)], 40, 1, 64, page_size=1, seed=3, device=CPU), torch.float32)


@needs_native
def test_decode_batch_of_unequal_lengths(paged_kv):
    lengths = [1, 2, 300, 17, 64, 65, 129, 250]
    check(paged_kv([(n - 1, 1) for n in lengths], 9, 3, 64, page_size=4, device=CPU), torch.float32)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv", [(9, 3), (4, 1)])
@pytest.mark.parametrize("new", [1, 2, 7])
def test_one_long_sequence_split_along_its_keys(paged_kv, dtype, hq, hkv, new):
    """Batch 1 with too few tiles for the threads (one per kv head): each chunk of a tile's
    keys is a task of its own, the partials folded after (attention_chunks.h). 1,500 keys:
    6 chunks; 7 new tokens: the last chunk holds the diagonal. Checked with 2 threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        check(
            paged_kv(
                [(1500 - new, new)], hq, hkv, 64, page_size=16, seed=new, device=CPU, dtype=dtype
            ),
            dtype,
        )
    finally:
        torch.set_num_threads(threads)


@needs_native
def test_mismatched_dtypes_are_refused(paged_kv):
    kv = paged_kv([(3, 1)], 4, 2, 64, page_size=4, device=CPU)
    with pytest.raises(RuntimeError, match="share one dtype"):
        OPS.paged_attention(
            kv.q.bfloat16(), kv.k_buffer, kv.v_buffer, kv.qo_indptr, kv.kv_indptr,
            kv.kv_indices, 0.125, 0, [], [],
        )  # fmt: skip


def cascade_reference(q, k_buffer, v_buffer, rows, own, prefix, scale):
    """Row i (a token) against its own slots `own[i]` and the shared `prefix`, unmasked."""
    hq, hkv = q.shape[1], k_buffer.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    lse = torch.empty(q.shape[:2], dtype=torch.float64)
    for i, row in enumerate(rows):
        slots = torch.cat([prefix, own[i]])
        k = k_buffer[slots].double().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        v = v_buffer[slots].double().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        scores = (q[row].double()[:, None, :] @ k.transpose(1, 2))[:, 0] * scale  # [Hq, L]
        out[row] = (torch.softmax(scores, -1)[:, None, :] @ v)[:, 0]
        lse[row] = torch.logsumexp(scores, -1)
    return out, lse


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,prefix_len", [(64, 512), (1, 256), (23, 256)])
def test_cascade_folds_a_shared_prefix_into_each_rows_own_keys(dtype, rows, prefix_len):
    """Decode rows whose sequences share a prefix of whole chunks: the cascade over it, then
    each row's own keys, equals attention over both, and equals bit for bit each row alone
    over all its keys; a row outside the cascade is unchanged."""
    gen = torch.Generator().manual_seed(rows + prefix_len)
    pool, hq, hkv, d = 2000, 9, 3, 64
    k_buffer = torch.randn(pool, hkv, d, generator=gen).to(dtype)
    v_buffer = torch.randn(pool, hkv, d, generator=gen).to(dtype)
    perm = torch.randperm(pool, generator=gen)
    prefix, rest = perm[:prefix_len], perm[prefix_len:].tolist()
    own = [torch.tensor([rest.pop() for _ in range(1 + i % 7)]) for i in range(rows + 1)]
    q = torch.randn(rows + 1, hq, d, generator=gen).to(dtype)  # the last row shares nothing
    qo = torch.arange(rows + 2, dtype=torch.int64)
    kv_indptr = torch.tensor([0, *(len(o) for o in own)], dtype=torch.int64).cumsum(0)
    cascade_rows = torch.arange(rows, dtype=torch.int64)
    out, lse = OPS.paged_attention(
        q, k_buffer, v_buffer, qo, kv_indptr, torch.cat(own), 0.125, 0, [cascade_rows], [prefix]
    )
    ref_out, ref_lse = cascade_reference(q, k_buffer, v_buffer, range(rows), own, prefix, 0.125)
    out_tol, lse_tol = TOLERANCE[dtype]
    torch.testing.assert_close(out[:rows].double(), ref_out[:rows], atol=out_tol, rtol=0)
    torch.testing.assert_close(lse[:rows].double(), ref_lse[:rows], atol=lse_tol, rtol=0)
    whole = [torch.cat([prefix, o]) for o in own[:rows]] + [own[rows]]
    whole_indptr = torch.tensor([0, *(len(w) for w in whole)], dtype=torch.int64).cumsum(0)
    alone_out, alone_lse = OPS.paged_attention(
        q, k_buffer, v_buffer, qo, whole_indptr, torch.cat(whole), 0.125, 0, [], []
    )
    assert torch.equal(out, alone_out) and torch.equal(lse, alone_lse)


@needs_native
def test_cascade_refuses_a_prefix_of_part_of_a_chunk():
    q = torch.randn(4, 9, 64)
    kv = torch.randn(300, 3, 64)
    qo, kvp = torch.arange(5), torch.arange(5)
    with pytest.raises(RuntimeError, match="whole chunks of 256 keys"):
        OPS.paged_attention(
            q, kv, kv, qo, kvp, torch.arange(4), 0.125, 0, [torch.arange(4)], [torch.arange(100)]
        )


def mixed_batch(pool: KVPool, backend: TorchAttentionBackend) -> ForwardBatch:
    """Three decodes and a 4-token extend sharing 300 slots, two 20-token extends sharing
    270, and a prefill; the other slots scattered over the pool. The kernel's cascades take
    256 of each shared prefix, the torch path's all of it."""
    decode_prefix, extend_prefix = list(range(0, 300)), list(range(300, 570))
    perm = (torch.randperm(2000, generator=torch.Generator().manual_seed(5)) + 600).tolist()
    seqs = [(decode_prefix + [perm.pop() for _ in range(n)], 1) for n in (3, 30, 7)]
    seqs += [(extend_prefix + [perm.pop() for _ in range(n)], 20) for n in (25, 40)]
    seqs += [
        (decode_prefix + [perm.pop() for _ in range(14)], 4),
        ([perm.pop() for _ in range(50)], 50),
    ]
    new = [n for _, n in seqs]
    lens = [len(slots) for slots, _ in seqs]

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64)

    return ForwardBatch(
        input_ids=t([0] * sum(new)), positions=t(sum((list(range(n - e, n)) for n, e in
        zip(lens, new, strict=True)), [])), out_cache_loc=t(sum((s[-e:] for s, e in seqs), [])),
        qo_indptr=t([0, *new]).cumsum(0), kv_indices=t(sum((s for s, _ in seqs), [])),
        kv_indptr=t([0, *lens]).cumsum(0), seq_lens=t(lens), extend_lens=t(new),
        seq_lens_cpu=lens, extend_lens_cpu=new, prefix_lens_cpu=[n - e for n, e in
        zip(lens, new, strict=True)], kv_pool=pool, attn_backend=backend,
    )  # fmt: skip


@needs_native
@pytest.mark.parametrize("window", [0, 8, 35])
def test_backend_native_path_matches_its_torch_path(window):
    """The whole backend, cascades included (none in a sliding window: its masks cut through
    the shared prefixes), against its own SDPA path on the same batch."""
    pool = KVPool(2700, 1, 3, 64, torch.float32, "cpu")
    pool.k_buffer[0].normal_()
    pool.v_buffer[0].normal_()
    backend = TorchAttentionBackend()
    fb = mixed_batch(pool, backend)
    t = fb.input_ids.numel()
    q, k, v = torch.randn(t, 9, 64), torch.randn(t, 3, 64), torch.randn(t, 3, 64)
    backend.init_forward_metadata(fb)
    assert fb.attn_metadata.native is not None and len(fb.attn_metadata.native.cascades) == 2
    native_out = backend.forward(q, k, v, 0, fb, 0.125, window)
    assert len(fb.attn_metadata.windowed) == (window > 0)
    full_out = backend.forward(q, k, v, 0, fb, 0.125)
    assert (window > 0) == (not torch.allclose(native_out, full_out, atol=1e-3))
    backend._native = None
    backend.init_forward_metadata(fb)
    assert fb.attn_metadata.native is None
    torch.testing.assert_close(
        native_out, backend.forward(q, k, v, 0, fb, 0.125, window), atol=2e-5, rtol=0
    )


def test_disabled_native_falls_back_to_torch(monkeypatch):
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    native.load_native.cache_clear()
    try:
        assert native.load_native() is None
        assert TorchAttentionBackend()._native is None
    finally:
        monkeypatch.delenv(native.DISABLE_ENV)
        native.load_native.cache_clear()


def test_build_key_follows_the_sources(tmp_path):
    src = tmp_path / "a.cpp"
    src.write_text("int a;")
    before = native.build_key([src])
    src.write_text("int b;")
    assert native.build_key([src]) != before
