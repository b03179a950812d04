"""GGUF files in every common llama.cpp block type, quantized by llama.cpp's own quantizer, for
checking radixrt's GGUF weights against llama.cpp (tests/e2e/test_gguf_llamacpp.py) and for
benchmarking them (scripts/bench_cpu.py --model-path).

    python scripts/gguf_variants.py --list
    python scripts/gguf_variants.py make Q4_K_M [--tiny | --model tiny-qwen2]   # prints the path
    python scripts/gguf_variants.py make all [--model M]

Models (--model):
- default: radixrt's default model (SmolLM2-135M-Instruct, Q4_1), written out as float32 and
  quantized again. Its width, 576, is not a multiple of 256, so llama.cpp stores every tensor
  whose rows are 576 long in a fallback type (Q2_K, Q3_K -> Q4_0; Q4_K -> Q5_0; Q5_K -> Q5_1;
  Q6_K -> Q8_0; IQ4_XS -> IQ4_NL): only ffn_down (rows of 1536) takes the 256-blocks.
  `--list` shows each file's types.
- tiny, tiny-qwen2: random weights whose widths are multiples of 256, so every type is used
  in full, with SmolLM2's vocabulary and tokenizer (llama; qwen2 with q/k/v biases).
- small, medium: the same at a 0.25B and a 0.6B model's widths, for benchmarks.

Files are cached under ~/.cache/radixrt/gguf-variants/ (RADIXRT_GGUF_VARIANTS), one folder per
model keyed by the hash of the file it comes from (and, for the tiny ones, their shape): its
F32.gguf and one <TYPE>.gguf per type. llama.cpp runs in its own venv (LLAMACPP_PYTHON below,
made by scripts/bench_cpu_setup.sh), through scripts/llamacpp_reference.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

CACHE = Path(
    os.environ.get("RADIXRT_GGUF_VARIANTS", Path.home() / ".cache" / "radixrt" / "gguf-variants")
)
VENVS = os.environ.get("RADIXRT_BENCH_VENVS", str(Path.home() / ".cache/radixrt-bench/venvs"))
LLAMACPP_PYTHON = Path(VENVS) / "llamacpp" / "bin" / "python"
REFERENCE = Path(__file__).with_name("llamacpp_reference.py")
# llama.cpp's file types (LLAMA_FTYPE_MOSTLY_<name>), one per GGUF block type to cover.
QTYPES = (
    "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1",
    "Q5_0", "Q5_1", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS",
)  # fmt: skip
THREADS = 2  # llama.cpp's quantizer
# llama.cpp's greedy runs: one thread gives the same logits, bit for bit, as two (checked on
# three files), and two slow to ~3 tok/s on a shared 2-core machine whenever another process
# holds a core (its threads wait for each other at every op).
REFERENCE_THREADS = 1


@dataclass(frozen=True)
class TinySpec:
    """A random-weight model: every width a multiple of 256 (a K-quant super-block)."""

    arch: str
    hidden: int = 256
    ffn: int = 768
    layers: int = 4  # 4, so that Q4_K_M's "more bits" layers (2 and 3) differ from the rest
    heads: int = 4
    kv_heads: int = 2
    seed: int = 0


TINY = {"tiny": TinySpec("llama"), "tiny-qwen2": TinySpec("qwen2", seed=1)}
MODELS = ("default", *TINY)  # the ones tests compare with llama.cpp
# For speed, not tests: every projection in K-quant blocks at 0.25B and 0.6B models' widths.
RANDOM = {
    **TINY,
    "small": TinySpec("llama", hidden=1024, ffn=2816, layers=16, heads=16, kv_heads=4, seed=2),
    "medium": TinySpec("llama", hidden=1536, ffn=4096, layers=18, heads=12, kv_heads=2, seed=3),
}


# -- reading files ------------------------------------------------------------------------------
@cache
def _file_key(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def file_key(path: str | Path) -> str:
    """The first 16 hex digits of the file's sha256 (computed once per process and version)."""
    st = os.stat(path)
    return _file_key(str(path), st.st_size, st.st_mtime_ns)


def types_in(path: str | Path) -> dict[str, int]:
    """How many tensors of each GGML type the file holds, e.g. {'Q5_0': 150, 'F32': 61}."""
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors)
    return dict(counts.most_common())


def _default_path() -> str:
    from radixrt.loader.default_model import default_model_path

    return default_model_path()


# -- writing float32 files ----------------------------------------------------------------------
@contextmanager
def _atomic(dst: Path) -> Iterator[Path]:
    """A temporary name to write dst under, moved in place once whole (so a file under CACHE
    is always complete, whoever else is making it), removed if the writing fails."""
    tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _copy_fields(reader: Any, writer: Any, keep: Any) -> None:
    """Copy the metadata fields whose key passes keep(key), with their GGUF value types."""
    from gguf import GGUFValueType

    for key, field in reader.fields.items():
        if keep(key):
            sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)


def write_f32_copy(src: str | Path, dst: Path) -> None:
    """The GGUF file src with every tensor dequantized to float32 (gguf-py's dequantizer) and
    every metadata field kept, its tokenizer included: llama.cpp's quantizer input."""
    from gguf import GGUFReader, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize

    reader = GGUFReader(str(src))
    # Not copied: the header's own counts, what the writer sets, and what a float32 file is not.
    skip = {"general.architecture", "general.file_type", "general.quantization_version"}
    with _atomic(dst) as tmp:
        writer = GGUFWriter(tmp, reader.fields["general.architecture"].contents())
        _copy_fields(reader, writer, lambda k: not k.startswith("GGUF.") and k not in skip)
        writer.add_file_type(LlamaFileType.ALL_F32)
        for t in reader.tensors:
            writer.add_tensor(t.name, np.asarray(dequantize(t.data, t.tensor_type), np.float32))
        _finish(writer)


def write_tiny(spec: TinySpec, dst: Path) -> None:
    """A float32 GGUF of random weights in llama.cpp's tensor names (and, for llama, its q/k
    row order), with the default model's vocabulary and tokenizer fields."""
    from gguf import GGUFReader, GGUFWriter, LlamaFileType

    vocab_file = GGUFReader(_default_path())
    vocab = len(vocab_file.fields["tokenizer.ggml.tokens"].data)
    with _atomic(dst) as tmp:
        w = GGUFWriter(tmp, spec.arch)  # its add_* write under "<arch>." keys
        _copy_fields(vocab_file, w, lambda k: k.startswith("tokenizer."))
        w.add_vocab_size(vocab)
        w.add_context_length(2048)
        w.add_embedding_length(spec.hidden)
        w.add_block_count(spec.layers)
        w.add_feed_forward_length(spec.ffn)
        w.add_head_count(spec.heads)
        w.add_head_count_kv(spec.kv_heads)
        w.add_rope_dimension_count(spec.hidden // spec.heads)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_file_type(LlamaFileType.ALL_F32)
        for name, array in _tiny_tensors(spec, vocab, np.random.default_rng(spec.seed)):
            w.add_tensor(name, array)
        _finish(w)


def _tiny_tensors(spec: TinySpec, vocab: int, rng: np.random.Generator):
    """(GGUF name, float32 [out, in]) of a tiny model, in the order llama.cpp writes them."""
    h, kv = spec.hidden, spec.kv_heads * (spec.hidden // spec.heads)
    yield "token_embd.weight", _weight(rng, vocab, h)
    for i in range(spec.layers):
        q, k = _weight(rng, h, h), _weight(rng, kv, h)
        if spec.arch == "llama":  # llama.cpp's converter interleaves each head's rope halves
            q, k = _llama_rows(q, spec.heads), _llama_rows(k, spec.kv_heads)
        blk = f"blk.{i}."
        yield blk + "attn_norm.weight", _norm(rng, h)
        yield blk + "attn_q.weight", q
        yield blk + "attn_k.weight", k
        yield blk + "attn_v.weight", _weight(rng, kv, h)
        if spec.arch == "qwen2":
            for part, width in (("q", h), ("k", kv), ("v", kv)):
                yield f"{blk}attn_{part}.bias", rng.normal(0, 0.1, width).astype(np.float32)
        yield blk + "attn_output.weight", _weight(rng, h, h)
        yield blk + "ffn_norm.weight", _norm(rng, h)
        yield blk + "ffn_gate.weight", _weight(rng, spec.ffn, h)
        yield blk + "ffn_up.weight", _weight(rng, spec.ffn, h)
        yield blk + "ffn_down.weight", _weight(rng, h, spec.ffn)
    yield "output_norm.weight", _norm(rng, h)
    # An untied head, so llama.cpp gives it its own (usually wider) type. Its scale spreads
    # the logits as a trained model's are spread (std ~1.5, not 0.3 with 0.02).
    yield "output.weight", _weight(rng, vocab, h, std=0.1)


def _weight(rng: np.random.Generator, rows: int, cols: int, std: float = 0.02) -> np.ndarray:
    """Gaussian weights with one entry in 500 ten times larger: trained weights have such
    outliers, and they are what a block's scale (and a K-quant's sub-scales) must fit."""
    w = rng.normal(0.0, std, (rows, cols))
    w[rng.random((rows, cols)) < 0.002] *= 10.0
    return w.astype(np.float32)


def _norm(rng: np.random.Generator, width: int) -> np.ndarray:
    return rng.normal(1.0, 0.05, width).astype(np.float32)


def _llama_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """HF rows (per head: first rope half, second half) in llama.cpp's order (the halves
    interleaved); radixrt.loader.gguf_loader.unpermute_qk is its inverse."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


# -- the cache ----------------------------------------------------------------------------------
def model_dir(model: str = "default") -> Path:
    """The folder of a model's files: keyed by the default model's hash (the source of its
    weights, or of a tiny model's vocabulary) and, for a tiny model, by its spec."""
    base = file_key(_default_path())
    if model == "default":
        return CACHE / f"default-{base}"
    spec_key = hashlib.sha256(f"{base} {RANDOM[model]}".encode()).hexdigest()[:16]
    return CACHE / f"{model}-{spec_key}"


def source_f32(model: str = "default") -> Path:
    """The model's float32 GGUF, written once."""
    dst = model_dir(model) / "F32.gguf"
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        if model == "default":
            write_f32_copy(_default_path(), dst)
        else:
            write_tiny(RANDOM[model], dst)
    return dst


def variant(qtype: str, model: str = "default") -> Path:
    """The model quantized by llama.cpp into qtype (one of QTYPES), made once."""
    if qtype not in QTYPES or model not in ("default", *RANDOM):
        raise ValueError(f"unknown variant {model}/{qtype}; types {QTYPES}, models {MODELS}")
    dst = model_dir(model) / f"{qtype}.gguf"
    if not dst.exists():
        src = source_f32(model)
        with _atomic(dst) as tmp:
            request = {"src": str(src), "dst": str(tmp), "ftype": qtype, "threads": THREADS}
            llamacpp([{"op": "quantize", **request}])
    return dst


# -- llama.cpp, in its own venv -----------------------------------------------------------------
def llamacpp_available() -> bool:
    return LLAMACPP_PYTHON.exists()


def llamacpp(requests: list[dict[str, Any]], timeout: float = 3600) -> list[dict[str, Any]]:
    """Serve requests (scripts/llamacpp_reference.py's ops) in one llama.cpp process."""
    if not llamacpp_available():
        raise FileNotFoundError(
            f"no llama.cpp venv at {LLAMACPP_PYTHON}: run scripts/bench_cpu_setup.sh"
        )
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    proc = subprocess.run(
        [str(LLAMACPP_PYTHON), str(REFERENCE)],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp worker exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def llamacpp_greedy(
    models: list[str | Path], prompts: list[list[int]], new_tokens: int
) -> list[list[dict[str, list]]]:
    """Per model, per prompt: llama.cpp's greedy tokens and each step's top-2 logit margin
    ({'tokens': [...], 'margins': [...]}); one process for all the models."""
    requests = [
        {"op": "greedy", "model": str(m), "prompts": prompts, "new_tokens": new_tokens}
        | {"threads": REFERENCE_THREADS}
        for m in models
    ]
    return [r["runs"] for r in llamacpp(requests)]


def llamacpp_tokenize(model: str | Path, texts: list[str]) -> list[list[int]]:
    """Token ids of texts by the file's own tokenizer in llama.cpp (special tokens added as the
    file says: none for SmolLM2)."""
    return llamacpp([{"op": "tokenize", "model": str(model), "texts": texts}])[0]["tokens"]


# -- CLI ----------------------------------------------------------------------------------------
def _list() -> None:
    for model in MODELS:
        folder = model_dir(model)
        print(f"{model}: {folder}")
        for qtype in ("F32", *QTYPES):
            path = folder / f"{qtype}.gguf"
            made = ", ".join(f"{n} {t}" for t, n in types_in(path).items()) if path.exists() else ""
            print(f"  {qtype:7} {made or 'not made'}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--list", action="store_true", help="every variant: made or not, its types")
    p.add_argument("command", nargs="?", choices=("make",))
    p.add_argument("qtype", nargs="?", choices=(*QTYPES, "all"))
    p.add_argument("--model", choices=("default", *RANDOM), default="default")
    p.add_argument("--tiny", action="store_true", help="same as --model tiny")
    args = p.parse_args(argv)
    if args.list:
        _list()
        return
    if args.command != "make" or not args.qtype:
        p.error("give --list, or: make TYPE")
    model = "tiny" if args.tiny else args.model
    for qtype in QTYPES if args.qtype == "all" else (args.qtype,):
        print(variant(qtype, model))


if __name__ == "__main__":
    main()
