"""/generate's streams as SGLang's: cumulative text, ids and logprob lists by default; only
the new part with --incremental-streaming-output (the engine's chunks carry the new text and
ids, and the logprob lists so far)."""

from __future__ import annotations

import asyncio

from radixrt.entrypoints.http_server import _stream_chunks


def engine_chunks() -> list[dict]:
    lps = [(-0.1, 5, None), (-0.2, 6, None), (-0.3, 7, None)]
    return [
        {
            "text": "a",
            "output_ids": [5],
            "meta_info": {"output_token_logprobs": lps[:1], "input_token_logprobs": [1]},
        },
        {
            "text": "bc",
            "output_ids": [6, 7],
            "meta_info": {"output_token_logprobs": lps, "input_token_logprobs": [1]},
        },
    ]


def run(incremental: bool) -> list[dict]:
    async def collect():
        async def source():
            for chunk in engine_chunks():
                yield chunk

        return [c async for c in _stream_chunks(source(), incremental)]

    return asyncio.run(collect())


def test_default_streams_carry_everything_so_far():
    first, second = run(False)
    assert (first["text"], first["output_ids"]) == ("a", [5])
    assert (second["text"], second["output_ids"]) == ("abc", [5, 6, 7])
    assert len(second["meta_info"]["output_token_logprobs"]) == 3


def test_incremental_streams_carry_only_the_new_part():
    first, second = run(True)
    assert (second["text"], second["output_ids"]) == ("bc", [6, 7])
    assert [e[1] for e in first["meta_info"]["output_token_logprobs"]] == [5]
    assert [e[1] for e in second["meta_info"]["output_token_logprobs"]] == [6, 7]
    assert second["meta_info"]["input_token_logprobs"] == [1]  # not an output list
