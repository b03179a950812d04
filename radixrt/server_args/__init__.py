"""The one configuration dataclass. The CLI and `Engine(**kwargs)` are generated from its fields.

Fields are grouped by subsystem: the first field of a group names it in `metadata["group"]`,
and the fields after it belong to it up to the next such field (`field_groups`); `--help` shows
them so. Each carries its help text in `metadata["help"]`, and, where the values are a fixed
set, `metadata["choices"]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from radixrt.server_args.bootstrap_peers import DEFAULT_PEERS
from radixrt.server_args.checks import validate_args


def _f(
    default: Any,
    help: str,
    choices: tuple | None = None,
    *,
    group: str = "",
    aliases: tuple[str, ...] = (),
) -> Any:
    meta: dict[str, Any] = {"help": help}
    if choices:
        meta["choices"] = choices
    if group:
        meta["group"] = group
    if aliases:
        meta["aliases"] = aliases
    return field(default=default, metadata=meta)


SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("auto", "none", "int8", "int4")
DENSE_COPY_DTYPES = ("bfloat16", "int8")  # radixrt/layers/quantized.py keeps them
DISAGGREGATION_MODES = ("null", "prefill", "decode")
DISAGGREGATION_BACKENDS = ("tcp",)
DISAGGREGATION_FAILURE_POLICIES = ("recompute", "fail")


@dataclass
class ServerArgs:
    model_path: str | None = _f(
        None,
        "HF model folder or .gguf file; default: SmolLM2-135M-Instruct",
        group="Model and tokenizer",
    )
    tokenizer_path: str | None = _f(None, "tokenizer folder or .gguf file; default: model_path")
    skip_tokenizer_init: bool = _f(False, "serve token ids only; no tokenizer is loaded")
    dtype: str = _f(
        "auto",
        "weights and activations dtype; auto: bfloat16 on CUDA and on a CPU with bf16 units, "
        "float32 otherwise",
        DTYPES,
    )
    quantization: str = _f(
        "auto",
        "weight format of the linear layers; auto: the checkpoint's own packed format where a "
        "CPU kernel runs it (GGUF Q4_*: int4, Q8_0: int8), else the dtype; none: dequantize; "
        "int8/int4: weight-only, groupwise (see docs/quantization.md)",
        QUANTIZATIONS,
    )
    device: str | None = _f(None, "cpu or cuda; default: cuda if available, else cpu")
    context_length: int | None = _f(None, "max tokens per sequence; default: the model's")
    random_seed: int = _f(0, "seed of the default sampling generator")
    page_size: int = _f(1, "tokens per KV page", group="Memory and KV cache")
    max_total_tokens: int | None = _f(
        None, "KV pool size in tokens; default: from the memory budget"
    )
    mem_fraction_static: float = _f(0.85, "fraction of GPU memory for weights + KV pool (CUDA)")
    cpu_kv_cache_gb: float = _f(1.0, "KV pool budget in GiB when running on the CPU")
    cpu_dense_copy_gb: float = _f(
        1.0,
        "0 turns the int8 kernel's tiles off. Under int8 activations at every step (bfloat16's "
        "default) the tiles replace the rows of Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K "
        "weights whatever this says (a tied Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 embedding's too), and only a "
        "tied K-quant embedding's tiles, kept beside its rows, count against it. With "
        "--cpu-gguf-int8-rows 1 or more: GiB for bfloat16 copies of packed weights that wider "
        "steps multiply with oneDNN on a bf16 CPU, and for the tiles beside them (each all or "
        "none; see docs/quantization.md)",
    )
    cpu_dense_copy_dtype: str = _f(
        "bfloat16",
        "dtype of those copies (kept under --dtype bfloat16 only); int8: per-channel int8 "
        "weights times per-token int8 activations (W8A8, VNNI): 0.68-0.75x the bf16 copies' "
        "time, with the rounding of both (see docs/quantization.md)",
        DENSE_COPY_DTYPES,
    )
    cpu_gguf_int8_rows: int | None = _f(
        None,
        "steps of up to this many rows multiply packed GGUF weights as llama.cpp does: the "
        "activations rounded to int8 per block, integer sums. Default: every step under "
        "bfloat16 (one arithmetic per weight, so a request's bits never depend on its batch), "
        "0 under float32 (exact products). -1: every step. A value from 1 up switches "
        "kernels by the step's row count (the dense copies for wider steps): faster prefill "
        "on bf16 CPUs, but a request's output then depends on its batch. See "
        "docs/determinism.md",
    )
    disable_radix_cache: bool = _f(False, "turn the radix prefix cache off (for comparison)")
    schedule_policy: str = _f(
        "lpm", "order of waiting requests", SCHEDULE_POLICIES, group="Scheduling"
    )
    chunked_prefill_size: int = _f(
        2048, "max prompt tokens prefilled per step per request; -1 disables chunking"
    )
    max_prefill_tokens: int | None = _f(
        None,
        "token budget of new prefill tokens per step; default: 8192 on a GPU, 2048 on the CPU "
        "(where smaller steps were faster: see docs/cpu_kernels.md)",
    )
    max_running_requests: int = _f(128, "max requests decoding at once")
    schedule_conservativeness: float = _f(1.0, "KV headroom reserved for running decodes")
    disable_jump_forward: bool = _f(
        False,
        "decode constrained text token by token, even where the grammar fixes it (for comparison)",
        group="Structured generation",
    )
    json_any_whitespace: bool = _f(
        False,
        "let JSON-schema output put any whitespace between "
        "tokens (xgrammar's default); off: json.dumps spacing",
    )
    speculative_algorithm: str | None = _f(
        None,
        "NGRAM: draft tokens from the request's own text and the radix cache, verified in one "
        "step (docs/speculative.md); default: off",
        ("NGRAM",),
        group="Speculative decoding",
    )
    speculative_num_draft_tokens: int = _f(
        12, "positions a request verifies per step: up to this many - 1 drafts and the next token"
    )
    speculative_ngram_min_match_window_size: int = _f(
        1, "shortest tail of a request that must have occurred before to draft from it"
    )
    speculative_ngram_max_match_window_size: int = _f(
        12, "longest tail matched when looking for where to draft from"
    )
    attention_backend: str | None = _f(
        None,
        "torch or triton; default: triton on CUDA, torch on CPU",
        ("torch", "triton"),
        group="Execution",
    )
    enable_deterministic_inference: bool = _f(
        False,
        "SGLang's flag: a request's tokens and logprobs are bit for bit what it gets alone, "
        "whatever its batch, prefill chunks, cache hits or speculation did. On the CPU this is "
        "the default and only behaviour: the flag changes nothing, and refuses the settings "
        "that would break it (--cpu-gguf-int8-rows from 1, --enable-torch-compile). On CUDA "
        "it selects the Triton attention's batch-invariant kernels (keys split every 256 "
        "positions, partials merged in a fixed order; --attention-backend triton, the "
        "default there), tested only under Triton's CPU interpreter; the GPU's matmuls "
        "(cuBLAS) are not invariant yet. See docs/determinism.md",
    )
    num_threads: int | None = _f(None, "torch CPU threads; default: torch's choice")
    enable_torch_compile: bool = _f(
        False, "compile the model forward with torch.compile (inductor) on the CPU"
    )
    torch_compile_max_bs: int = _f(32, "largest decode batch run through the compiled forward")
    disable_cuda_graph: bool = _f(False, "run CUDA decode steps without CUDA graphs")
    cuda_graph_max_bs: int = _f(64, "largest decode batch captured in a CUDA graph")
    tp_size: int = _f(
        1,
        "tensor-parallel ranks (NCCL on CUDA, gloo on the CPU); one node starts them itself",
        group="Parallelism and KV events",
        aliases=("--tp",),
    )
    dp_size: int = _f(1, "data-parallel replicas, each its own scheduler, for a router (SMG)")
    nnodes: int = _f(1, "nodes the tensor-parallel ranks span (as SGLang's --nnodes)")
    node_rank: int = _f(0, "this node's index among --nnodes")
    dist_init_addr: str | None = _f(
        None, "HOST:PORT of torch.distributed's rendezvous; default: a free loopback port"
    )
    dist_timeout: float = _f(
        60.0, "seconds a collective may wait for a rank before the server fails naming it"
    )
    kv_events_config: str | None = _f(
        None,
        "JSON, as vLLM's: publish KV cache events over ZeroMQ, e.g. "
        """{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557", """
        """"topic": "kv-events", "replay_endpoint": "tcp://127.0.0.1:5558"}; the endpoint """
        "binds 127.0.0.1:5557 by default (vLLM's: every interface); tcp://*:PORT binds every "
        "interface, with a warning",
    )
    disaggregation_mode: str = _f(
        "null",
        "prefill/decode disaggregation, SGLang's roles behind SMG's --pd-disaggregation: prefill "
        "runs prompts and sends their KV pages, decode receives them and decodes "
        "(docs/disaggregation.md)",
        DISAGGREGATION_MODES,
        group="Prefill/decode disaggregation",
    )
    disaggregation_bootstrap_port: int = _f(
        8998, "prefill: the port (on --host) where decode servers ask for KV pages"
    )
    disaggregation_transfer_backend: str = _f(
        "tcp",
        "how pages move: tcp (ZeroMQ over TCP, pages as raw bytes; loopback on one machine)",
        DISAGGREGATION_BACKENDS,
    )
    disaggregation_transfer_timeout: float = _f(
        30.0,
        "seconds a room may wait for its peer: decode, for the pages it asked for; prefill, "
        "for a decode server to ask for a finished prompt's pages",
    )
    disaggregation_failure_policy: str = _f(
        "recompute",
        "decode, when a transfer fails or times out: recompute the prompt here, or fail the "
        "request (vLLM's kv_load_failure_policy)",
        DISAGGREGATION_FAILURE_POLICIES,
    )
    disaggregation_bootstrap_peers: str = _f(
        DEFAULT_PEERS,
        "decode: the prefill servers this server may pull KV pages from, comma-separated "
        "host:port (a host alone: any port; [v6]:port); a request naming another "
        "bootstrap_host gets 400. Names are resolved once, at start-up",
    )
    disaggregation_bootstrap_key: str | None = _f(
        None,
        "the bootstrap channel's shared key: each side signs its messages with it (HMAC-SHA256) "
        "and drops the other's that do not verify; needed to bind a --host other than loopback "
        "(prefill) or to pull from a peer other than loopback (decode); default: "
        "$RADIXRT_DISAGGREGATION_BOOTSTRAP_KEY, else --api-key",
    )
    host: str = _f(
        "127.0.0.1",
        "address the HTTP server binds; 0.0.0.0 exposes it",
        group="Server (radixrt launch)",
    )
    port: int = _f(30000, "HTTP port")
    api_key: str | None = _f(
        None,
        "when set, every endpoint but /health needs "
        "'Authorization: Bearer KEY'; default: $RADIXRT_API_KEY (keeps "
        "the key out of `ps`)",
    )
    chat_template: str | None = _f(
        None,
        "replace the model's chat template: a Jinja file's path, or a name shipped with "
        "radixrt; default: the tokenizer's own",
    )
    served_model_name: str | None = _f(
        None, "model name of the OpenAI API; default: the model path, or SmolLM2-135M-Instruct"
    )
    max_queued_requests: int | None = _f(
        None,
        "requests waiting beyond max_running_requests before new ones get 503; default: no limit",
    )
    max_request_bytes: int = _f(
        4 * 1024 * 1024,
        "largest HTTP request body (and ZeroMQ "
        "message) in bytes; a larger one gets 413 before it is parsed",
    )
    max_prompt_chars: int = _f(
        1_000_000,
        "longest prompt (or chat conversation) in characters, checked before tokenization",
    )
    max_request_batch_size: int = _f(
        1024, "most requests one /generate call may make (prompts times n)"
    )
    max_logprobs: int = _f(
        20,
        "largest top_logprobs_num (OpenAI's top_logprobs / logprobs) a "
        "request may ask for, as vLLM's --max-logprobs",
    )
    max_logprob_entries: int = _f(
        1_000_000,
        "most (token, logprob) entries one request may "
        "produce: (prompt tokens scored + max_new_tokens) times "
        "(1 + top_logprobs_num + len(token_ids_logprob))",
    )
    grammar_compile_timeout: float = _f(
        10.0,
        "seconds a regex / json_schema / ebnf may take to "
        "check and compile; longer is a 400 naming the field",
    )
    graceful_shutdown_timeout: float = _f(
        0.0,
        "on SIGTERM, seconds to let running requests "
        "finish before they are ended (new ones get 503)",
    )
    incremental_streaming_output: bool = _f(
        False,
        "streamed /generate chunks carry only the "
        "new text, output_ids and output logprobs "
        "(default: everything so far, as SGLang)",
    )
    enable_kv_checks: bool = _f(
        False, "check KV accounting after every scheduler step", group="Debugging and logging"
    )
    log_level: str = _f("info", "logging level", ("debug", "info", "warning", "error"))
    log_requests: bool = _f(
        False, "log one access line per HTTP request (method, path, status, time)"
    )

    def __post_init__(self) -> None:
        if self.api_key is None:
            self.api_key = os.environ.get("RADIXRT_API_KEY") or None
        if self.disaggregation_bootstrap_key is None:
            env = os.environ.get("RADIXRT_DISAGGREGATION_BOOTSTRAP_KEY")
            self.disaggregation_bootstrap_key = env or None
        self.validate()

    def validate(self) -> None:
        """ValueError naming the first field out of its range (server_args/checks.py)."""
        validate_args(self)

    @property
    def bootstrap_key(self) -> str | None:
        """The key the bootstrap channel is signed with: its own, else the API key."""
        return self.disaggregation_bootstrap_key or self.api_key

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ServerArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}; allowed: {sorted(names)}")
        return cls(**kwargs)

    @classmethod
    def field_groups(cls) -> list[tuple[str, list[dataclasses.Field]]]:
        """(title, fields) per subsystem, in declaration order."""
        groups: list[tuple[str, list[dataclasses.Field]]] = []
        for f in dataclasses.fields(cls):
            if "group" in f.metadata or not groups:
                groups.append((f.metadata.get("group", "Options"), []))
            groups[-1][1].append(f)
        return groups

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, in an argument group per subsystem, each help ending with the
        default (bool flags: off)."""
        for title, fields in cls.field_groups():
            group = parser.add_argument_group(title)
            for f in fields:
                flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ())]
                if f.type in ("bool", bool):
                    group.add_argument(*flags, action="store_true", help=_help_with_default(f))
                    continue
                group.add_argument(
                    *flags,
                    type=_cli_type(f),
                    default=f.default,
                    choices=f.metadata.get("choices"),
                    help=_help_with_default(f),
                )

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> ServerArgs:
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})


def _help_with_default(f: dataclasses.Field) -> str:
    """The field's help, '%' escaped for argparse, with its default unless the text already
    explains it (a None default means "derived": the help says from what)."""
    text = f.metadata["help"].replace("%", "%%")
    if "default:" in text:
        return text
    default = "off" if f.default is False else f.default
    return f"{text} (default: {default})"


def _cli_type(f: dataclasses.Field) -> type:
    text = str(f.type)
    if text.startswith("int"):
        return int
    if text.startswith("float"):
        return float
    return str
