"""ServerArgs' checks: each field's range and the rules between fields, as ValueErrors that
name the field and its allowed values. Kept beside server_args.py, which declares the fields."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from radixrt.server_args.bootstrap_peers import is_loopback, parse_bootstrap_peers

if TYPE_CHECKING:
    from radixrt.server_args import ServerArgs


def validate_args(args: ServerArgs) -> None:
    """Every field's range, then the groups' own checks; ValueError naming the field."""
    for f in dataclasses.fields(args):
        choices = f.metadata.get("choices")
        value = getattr(args, f.name)
        if choices and value is not None and value not in choices:
            raise ValueError(f"{f.name} must be one of {list(choices)}, got {value!r}")
    if args.page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {args.page_size}")
    if args.max_total_tokens is not None and args.max_total_tokens < args.page_size:
        raise ValueError(
            f"max_total_tokens must be >= page_size ({args.page_size}), got {args.max_total_tokens}"
        )
    if args.chunked_prefill_size != -1 and args.chunked_prefill_size < 1:
        raise ValueError(
            f"chunked_prefill_size must be -1 (off) or >= 1, got {args.chunked_prefill_size}"
        )
    if args.max_prefill_tokens is not None and args.max_prefill_tokens < 1:
        raise ValueError(f"max_prefill_tokens must be >= 1, got {args.max_prefill_tokens}")
    if args.cpu_gguf_int8_rows is not None and args.cpu_gguf_int8_rows < -1:
        raise ValueError(
            f"cpu_gguf_int8_rows must be -1 (every step) or >= 0, got {args.cpu_gguf_int8_rows}"
        )
    _check_deterministic(args)
    if args.cpu_dense_copy_gb < 0:
        raise ValueError(f"cpu_dense_copy_gb must be >= 0, got {args.cpu_dense_copy_gb}")
    if args.max_running_requests < 1:
        raise ValueError(f"max_running_requests must be >= 1, got {args.max_running_requests}")
    if args.max_queued_requests is not None and args.max_queued_requests < 0:
        raise ValueError(f"max_queued_requests must be >= 0, got {args.max_queued_requests}")
    _validate_speculative(args)
    _validate_disaggregation(args)
    for name in ("tp_size", "dp_size", "nnodes", "torch_compile_max_bs"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(
            f"node_rank must be in 0..{args.nnodes - 1} (nnodes - 1), got {args.node_rank}"
        )
    if args.dist_timeout <= 0:
        raise ValueError(f"dist_timeout must be > 0, got {args.dist_timeout}")
    if not 0 < args.port < 65536:
        raise ValueError(f"port must be in 1..65535, got {args.port}")
    for name in (
        "max_request_bytes",
        "max_prompt_chars",
        "max_request_batch_size",
        "max_logprob_entries",
    ):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")
    if args.max_logprobs < 0:
        raise ValueError(f"max_logprobs must be >= 0, got {args.max_logprobs}")
    if args.grammar_compile_timeout <= 0 or args.graceful_shutdown_timeout < 0:
        raise ValueError(
            "grammar_compile_timeout must be > 0 and graceful_shutdown_timeout "
            f">= 0, got {args.grammar_compile_timeout} and "
            f"{args.graceful_shutdown_timeout}"
        )
    if not 0 < args.mem_fraction_static <= 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1], got {args.mem_fraction_static}")
    if args.chat_template is not None:  # a bad one fails now, not after the model loads
        from radixrt.frontend.chat_template_loader import load_chat_template

        load_chat_template(args.chat_template)
    if args.kv_events_config is not None:  # likewise: a bad config fails at the flags
        from radixrt.observability.kv_events import parse_kv_events_config

        parse_kv_events_config(args.kv_events_config)


def _validate_speculative(args: ServerArgs) -> None:
    if args.speculative_num_draft_tokens < 2:
        raise ValueError(
            "speculative_num_draft_tokens must be >= 2 (one draft and the token after it), "
            f"got {args.speculative_num_draft_tokens}"
        )
    low = args.speculative_ngram_min_match_window_size
    high = args.speculative_ngram_max_match_window_size
    if not 1 <= low <= high:
        raise ValueError(
            "speculative_ngram_min_match_window_size must be >= 1 and <= "
            f"speculative_ngram_max_match_window_size, got {low} and {high}"
        )


def _validate_disaggregation(args: ServerArgs) -> None:
    parse_bootstrap_peers(args.disaggregation_bootstrap_peers)  # its syntax, in any mode
    if args.disaggregation_mode == "null":
        return
    if not 0 < args.disaggregation_bootstrap_port < 65536:
        raise ValueError(
            "disaggregation_bootstrap_port must be in 1..65535, got "
            f"{args.disaggregation_bootstrap_port}"
        )
    if args.disaggregation_mode == "prefill" and args.disaggregation_bootstrap_port == args.port:
        raise ValueError(
            "disaggregation_bootstrap_port must differ from port (the HTTP server's), both "
            f"are {args.port}"
        )
    if args.disaggregation_transfer_timeout <= 0:
        raise ValueError(
            "disaggregation_transfer_timeout must be > 0, got "
            f"{args.disaggregation_transfer_timeout}"
        )
    for name in ("tp_size", "dp_size"):
        if getattr(args, name) != 1:
            raise ValueError(
                f"{name} must be 1 with disaggregation_mode {args.disaggregation_mode!r}: "
                "each side runs one rank for now (docs/disaggregation.md)"
            )
    _check_bootstrap_trust(args)


def _check_bootstrap_trust(args: ServerArgs) -> None:
    """A bootstrap channel that leaves the machine needs a key: a prefill server binding
    anything but loopback, or a decode server allowed a peer that is not loopback."""
    if args.bootstrap_key:
        return
    need = "set disaggregation_bootstrap_key (or api_key) on both servers"
    if args.disaggregation_mode == "prefill" and not is_loopback(args.host):
        raise ValueError(
            f"host {args.host!r} exposes the bootstrap port {args.disaggregation_bootstrap_port} "
            f"beyond this machine, where anyone could ask for KV pages: {need}, or bind "
            "host 127.0.0.1"
        )
    rules = parse_bootstrap_peers(args.disaggregation_bootstrap_peers)
    outside = [rule.describe() for rule in rules if not is_loopback(rule.host)]
    if args.disaggregation_mode == "decode" and outside:
        raise ValueError(
            "disaggregation_bootstrap_peers names peers beyond this machine "
            f"({', '.join(outside)}), whose pages would enter the radix cache "
            f"unauthenticated: {need}"
        )


def _check_deterministic(args: ServerArgs) -> None:
    """--enable-deterministic-inference refuses what would make a request's bits depend on
    its batch: kernels chosen by the step's row count, a compiled decode, the torch attention
    on CUDA. On CUDA it selects the Triton attention's invariant kernels."""
    if not args.enable_deterministic_inference:
        return
    if args.cpu_gguf_int8_rows is not None and args.cpu_gguf_int8_rows > 0:
        raise ValueError(
            "enable_deterministic_inference needs cpu_gguf_int8_rows -1 (every step) or 0 "
            f"(never) or unset, got {args.cpu_gguf_int8_rows}: other values choose the "
            "matmul by the step's row count"
        )
    if args.enable_torch_compile:
        raise ValueError(
            "enable_deterministic_inference and enable_torch_compile cannot be combined: "
            "compiled decode steps add up in another order than prefill steps"
        )
    on_cuda = args.device is not None and args.device.startswith("cuda")
    if on_cuda and args.attention_backend == "torch":
        raise ValueError(
            "enable_deterministic_inference on CUDA needs attention_backend triton (or unset: "
            "triton is the default there), got 'torch': only the Triton kernels have "
            "batch-invariant variants on the GPU"
        )
