"""Builds what the scheduler owns from the config: model, KV pool, allocator, cache, runner."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from radixrt.attention.base import create_backend
from radixrt.cache.allocator import PageAllocator
from radixrt.cache.base import PrefixCache, create_prefix_cache
from radixrt.cache.kv_pool import KVPool
from radixrt.cache.req_to_token import ReqToTokenTable
from radixrt.distributed import TPGroup
from radixrt.executor.model_runner import ModelRunner
from radixrt.layers.config import TransformerConfig
from radixrt.loader.default_model import default_model_path
from radixrt.loader.load import load_model
from radixrt.observability.kv_events import create_kv_event_sink
from radixrt.observability.log_setup import format_bytes
from radixrt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Keep the pool from exceeding this many tokens on CPU even when the budget allows more: a
# larger pool only costs memory there.
MAX_CPU_POOL_TOKENS = 1 << 20


@dataclass
class Components:
    model_config: TransformerConfig
    runner: ModelRunner
    allocator: PageAllocator
    cache: PrefixCache
    table: ReqToTokenTable
    pool_tokens: int
    dtype: torch.dtype
    device: str
    attention_backend: str
    context_length: int
    tokenizer: Any


def resolve_device(device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available; use 'cpu'")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    return device


def pool_size_tokens(
    args: ServerArgs, cfg: TransformerConfig, dtype: torch.dtype, device: str, kv_heads: int
) -> int:
    """`kv_heads`: the KV heads this rank's pool holds (all of them at tp 1)."""
    per_token = KVPool.bytes_per_token(cfg.num_layers, kv_heads, cfg.head_dim, dtype)
    if args.max_total_tokens is not None:
        tokens = args.max_total_tokens
    elif device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        budget = free - total * (1 - args.mem_fraction_static)
        if budget <= 0:
            raise ValueError(
                f"mem_fraction_static={args.mem_fraction_static} leaves no room "
                "for the KV pool after the weights; raise it"
            )
        tokens = int(budget // per_token)
    else:
        tokens = min(int(args.cpu_kv_cache_gb * (1 << 30) // per_token), MAX_CPU_POOL_TOKENS)
    return tokens // args.page_size * args.page_size


def build_components(
    args: ServerArgs, tokenizer: Any = None, group: TPGroup | None = None
) -> Components:
    """`group`: this rank's tensor-parallel group (None: one rank); its device is the rank's."""
    device = str(group.device) if group is not None else resolve_device(args.device)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    model_path = args.model_path or default_model_path()
    # FileNotFoundError names a bad path. With a group: this rank's shard of the model.
    # load_model resolves --dtype (auto depends on whether the weights are packed).
    model, cfg = load_model(
        model_path, args.dtype, device, group, quantization=args.quantization,
        dense_copy_gb=args.cpu_dense_copy_gb, dense_copy_dtype=args.cpu_dense_copy_dtype,
        int8_rows=args.cpu_gguf_int8_rows,
    )  # fmt: skip
    kv_heads = model.num_local_kv_heads
    context_length = args.context_length or cfg.max_position_embeddings
    dtype = cfg.dtype
    assert dtype is not None  # load_model sets it
    tokens = pool_size_tokens(args, cfg, dtype, device, kv_heads)
    if group is not None:  # every rank's pool must have the same pages: the smallest
        gathered = group.all_gather(torch.tensor([tokens], device=group.device), dim=0)
        tokens = int(gathered.min())
    start = time.monotonic()
    pool = KVPool(tokens, cfg.num_layers, kv_heads, cfg.head_dim, dtype, device)
    allocator = PageAllocator(tokens // args.page_size, args.page_size)
    cache = create_prefix_cache("none" if args.disable_radix_cache else "radix", allocator)
    if group is None or group.is_leader:  # one publisher: every rank's cache is rank 0's
        cache.event_sink = create_kv_event_sink(args.kv_events_config, args.page_size)
    table = ReqToTokenTable(args.max_running_requests, context_length, device)
    _log_pool(pool, args.page_size, time.monotonic() - start)
    backend_name = args.attention_backend or ("triton" if device.startswith("cuda") else "torch")
    backend = create_backend(
        backend_name,
        device=device,
        deterministic=args.enable_deterministic_inference,  # the triton backend's variants
        context_length=context_length,
    )
    start = time.monotonic()
    runner = ModelRunner(
        model,
        pool,
        backend,
        table,
        device,
        # The collectives of a sharded model have not been captured in a graph on a GPU yet.
        disable_cuda_graph=args.disable_cuda_graph or args.tp_size > 1,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        enable_torch_compile=args.enable_torch_compile,
        torch_compile_max_bs=args.torch_compile_max_bs,
    )
    if runner.graph_runner is not None:
        logger.info("warm-up: CUDA graphs captured in %.1f s", time.monotonic() - start)
    return Components(
        cfg,
        runner,
        allocator,
        cache,
        table,
        tokens,
        dtype,
        device,
        backend_name,
        context_length,
        tokenizer,
    )


def _log_pool(pool: KVPool, page_size: int, seconds: float) -> None:
    per_token = KVPool.bytes_per_token(
        pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype
    )
    logger.info(
        "KV pool: %d tokens (%s), page size %d, built in %.2f s",
        pool.size,
        format_bytes(pool.size * per_token),
        page_size,
        seconds,
    )
