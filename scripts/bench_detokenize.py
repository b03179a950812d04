"""Per-token cost of the detokenizer's two paths, side by side in one run: DecodeStream (the
`tokenizers` package, detokenizer/decode_stream.py's StreamDecoder) and the tokenizer's own decode
over a window (WindowDecoder), each inside IncrementalDetokenizer fed one token at a time, as
the scheduler sends a decode step's output.

    python scripts/bench_detokenize.py                      # the default model's tokenizer
    python scripts/bench_detokenize.py --tokenizer DIR --tokens 20000 --repeats 5

Both paths are checked to give the same text before anything is timed.
"""

from __future__ import annotations

import argparse
import time

from radixrt.detokenizer.decode_stream import StreamDecoder, WindowDecoder
from radixrt.detokenizer.detokenizer import IncrementalDetokenizer

SAMPLE = (
    "The radix cache keeps finished sequences in a tree keyed by token ids; a new request "
    "walks it and reuses the KV of its longest cached prefix. Émojis 🙂🚀, accents (déjà vu), "
    '中文字符 and code: `def f(x): return {"a": [1, 2.5]}`.\n'
)


def load(path: str | None):
    from radixrt.loader.default_model import default_model_path
    from radixrt.loader.tokenizer import load_tokenizer

    return load_tokenizer(path or default_model_path())


def stream_text(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[str, float]:
    """(the streamed text, seconds) for `ids` fed one at a time."""
    parts = []
    start = time.perf_counter()
    for token in ids[:-1]:
        parts.append(detok.add([token]))
    parts.append(detok.finish(ids[-1:], None))
    return "".join(parts), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", help="a tokenizer folder or .gguf (default: the model's)")
    parser.add_argument("--tokens", type=int, default=10_000, help="ids per stream")
    parser.add_argument("--repeats", type=int, default=3, help="runs per path; the best counts")
    args = parser.parse_args()
    tokenizer = load(args.tokenizer)
    unit = tokenizer.encode(SAMPLE, add_special_tokens=False)
    ids = (unit * (args.tokens // len(unit) + 1))[: args.tokens]

    def fast() -> IncrementalDetokenizer:
        detok = IncrementalDetokenizer(tokenizer)
        assert isinstance(detok.decoder, StreamDecoder), "this tokenizer has no DecodeStream"
        return detok

    def window() -> IncrementalDetokenizer:
        decode = WindowDecoder(lambda x: tokenizer.decode(x, skip_special_tokens=True))
        return IncrementalDetokenizer(tokenizer, decoder=decode)

    results = {}
    for name, make in (("DecodeStream", fast), ("window decode", window)):
        runs = [stream_text(make(), ids) for _ in range(args.repeats)]
        results[name] = min(seconds for _, seconds in runs)
        texts = {text for text, _ in runs}
        assert texts == {tokenizer.decode(ids)}, f"{name} streamed other text"
    print(f"tokenizer: {type(tokenizer).__name__}, {len(ids)} ids, best of {args.repeats}")
    print(f"{'path':<14} {'µs/token':>9}")
    for name, seconds in results.items():
        print(f"{name:<14} {seconds / len(ids) * 1e6:>9.2f}")
    ratio = results["window decode"] / results["DecodeStream"]
    print(f"DecodeStream is {ratio:.1f}x faster per token")


if __name__ == "__main__":
    main()
