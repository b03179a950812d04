"""Paged attention with the Triton kernels of `radixrt.kernels`: the default on CUDA.

A decode-only batch (one new token per sequence) runs the split-KV decode kernel; any other
batch (prefill chunks, possibly mixed with decode steps) runs the extend kernel once for all
sequences. Both read K/V in place in the pool through `kv_indices`, and the new tokens' K/V go
into their slots through one fused store kernel.

With `deterministic` (--enable-deterministic-inference) both run their batch-invariant variants
(kernels/invariant_attention.py): keys split at fixed positions, partials folded in a fixed
order, so a row's bits depend on its own sequence only, and a decode step's row is the same in
a decode-only batch and in a mixed one. Without it the decode splits follow the batch (faster
on few long sequences) and the bits may change with it.

On the CPU the kernels run only under Triton's interpreter (TRITON_INTERPRET=1): slow, meant for
tests, and asked for explicitly with attention_backend="triton".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.attention.base import AttentionBackend
from radixrt.attention.forward_batch import ForwardBatch
from radixrt.kernels.common import interpreting
from radixrt.kernels.decode_attention import choose_num_splits, decode_attention
from radixrt.kernels.extend_attention import extend_attention
from radixrt.kernels.fused_layers import store_kv
from radixrt.kernels.invariant_attention import (
    decode_attention_invariant,
    extend_attention_invariant,
)

# Stands in for the SM count on the CPU: there every program is interpreted Python, so a few
# programs in all are quickest.
CPU_NUM_SMS = 2


@dataclass(frozen=True)
class TritonAttentionMetadata:
    decode: bool  # every sequence has exactly one new token: the split-KV decode kernel
    qo_indptr: torch.Tensor  # [B+1]
    kv_indptr: torch.Tensor  # [B+1]
    kv_indices: torch.Tensor  # [sum(seq_lens)]
    max_new_tokens: int  # the longest sequence's new tokens (sets the extend grid)
    num_splits: int  # the default decode kernel's KV splits a sequence (full-attention layers)
    max_seq_len: int | None  # the longest sequence; None under CUDA graphs (any length)
    num_sms: int  # of the device, for the windowed layers' split counts


class TritonAttentionBackend(AttentionBackend):
    """Paged attention with Triton kernels; runs under CUDA graphs (see init_graph_metadata).

    `device`: where the model runs, if the caller knows it; on "cpu" (or with no CUDA at all)
    the backend refuses to start unless Triton's interpreter is on. `deterministic`: the
    batch-invariant kernels (see the module doc). `context_length`: the longest sequence the
    server admits; under CUDA graphs it sizes the invariant decode's chunk programs (without
    it one program per sequence folds every chunk: the same bits, less parallel)."""

    supports_cuda_graph = True

    def __init__(
        self,
        device: str | None = None,
        deterministic: bool = False,
        context_length: int | None = None,
        **kwargs: object,
    ) -> None:
        del kwargs  # options of other backends
        on_cpu = (device == "cpu") if device is not None else not torch.cuda.is_available()
        if on_cpu and not interpreting():
            raise ValueError(
                "attention_backend='triton' needs CUDA, or on the CPU Triton's interpreter "
                "(set TRITON_INTERPRET=1 in the environment; slow, for tests); "
                "use attention_backend='torch' on the CPU"
            )
        self._num_sms: dict[torch.device, int] = {}
        self._context_length = context_length
        # The variant is bound once: forward names no flag.
        self._decode = self._decode_invariant if deterministic else self._decode_by_batch
        self._extend = extend_attention_invariant if deterministic else extend_attention

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Sets `fb.attn_metadata`; the default decode's split count comes from the batch and
        the longest sequence (the invariant decode's from each sequence's own length)."""
        fb.attn_metadata = self._metadata(fb, max(fb.seq_lens_cpu, default=0))

    def init_graph_metadata(self, fb: ForwardBatch) -> None:
        """Metadata for a decode batch captured in a CUDA graph: fb's index tensors are the
        graph's static buffers, and the split count depends on the batch size alone (the
        invariant decode's grid on the context length), so one captured graph serves every
        sequence length."""
        assert fb.is_decode_only
        fb.attn_metadata = self._metadata(fb, None)

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        layer_id: int,
        fb: ForwardBatch,
        scaling: float,
        window: int = 0,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Store k/v at fb.out_cache_loc (negative slots: padding, skipped), then attend (over
        the last `window` positions only, if window > 0)."""
        k_buffer, v_buffer = fb.kv_pool.get_kv(layer_id)
        store_kv(k_buffer, v_buffer, fb.out_cache_loc, k, v)
        meta = fb.attn_metadata
        assert isinstance(meta, TritonAttentionMetadata), "init_forward_metadata did not run"
        if meta.decode:
            return self._decode(q, k_buffer, v_buffer, meta, fb, scaling, window)
        return self._extend(
            q,
            k_buffer,
            v_buffer,
            meta.qo_indptr,
            meta.kv_indptr,
            meta.kv_indices,
            meta.max_new_tokens,
            scaling,
            window=window,
        )

    def _decode_by_batch(
        self,
        q: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        meta: TritonAttentionMetadata,
        fb: ForwardBatch,
        scaling: float,
        window: int,
    ) -> torch.Tensor:
        """The default decode: split counts from the batch, the SMs and the longest sequence."""
        splits = self._windowed_splits(meta, fb, window) if window > 0 else meta.num_splits
        return decode_attention(
            q, k_buffer, v_buffer, meta.kv_indptr, meta.kv_indices, scaling, splits, window=window
        )

    def _decode_invariant(
        self,
        q: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        meta: TritonAttentionMetadata,
        fb: ForwardBatch,
        scaling: float,
        window: int,
    ) -> torch.Tensor:
        """Chunks of 256 keys at fixed positions; the longest sequence (under CUDA graphs the
        context length) only sizes the grid."""
        del fb  # the batch decides nothing here
        bound = meta.max_seq_len if meta.max_seq_len is not None else self._context_length
        return decode_attention_invariant(
            q, k_buffer, v_buffer, meta.kv_indptr, meta.kv_indices, scaling, bound, window=window
        )

    def _metadata(self, fb: ForwardBatch, max_seq_len: int | None) -> TritonAttentionMetadata:
        decode = fb.is_decode_only
        num_sms = self._sm_count(fb.kv_indices.device)
        num_splits = 1
        if decode:
            num_splits = choose_num_splits(
                fb.batch_size, fb.kv_pool.num_kv_heads, max_seq_len, num_sms
            )
        return TritonAttentionMetadata(
            decode,
            fb.qo_indptr,
            fb.kv_indptr,
            fb.kv_indices,
            max(fb.extend_lens_cpu, default=0),
            num_splits,
            max_seq_len,
            num_sms,
        )

    @staticmethod
    def _windowed_splits(meta: TritonAttentionMetadata, fb: ForwardBatch, window: int) -> int:
        """A sliding-window layer reads at most `window` keys a sequence: fewer splits. Depends
        on the batch size and the window alone under CUDA graphs (max_seq_len None), so the
        captured launch fits every replay."""
        keys = window if meta.max_seq_len is None else min(meta.max_seq_len, window)
        return choose_num_splits(fb.batch_size, fb.kv_pool.num_kv_heads, keys, meta.num_sms)

    def _sm_count(self, device: torch.device) -> int:
        if device.type != "cuda":
            return CPU_NUM_SMS
        if device not in self._num_sms:
            props = torch.cuda.get_device_properties(device)
            self._num_sms[device] = props.multi_processor_count
        return self._num_sms[device]
