"""OpenAI response pieces that need the tokenizer or a stream's state: token strings and bytes
for logprobs, and the chunk sequences of streamed chat and text completions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from functools import lru_cache
from typing import Any

from radixrt.entrypoints.http_utils import Chunks
from radixrt.entrypoints.openai import translate
from radixrt.entrypoints.openai.tool_calls import (
    AutoToolStream,
    ForcedCallScanner,
    ToolCall,
    ToolPlan,
    new_call_id,
)


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE maps each byte to a printable character; this is its inverse."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenTexts:
    """The text and UTF-8 bytes of single tokens. A byte-level BPE token may hold part of a
    character: its bytes are exact, its text has U+FFFD for the missing part."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_level = _is_byte_level(tokenizer)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def get(self, token_id: int) -> tuple[str, bytes]:
        if token_id not in self._cache:
            data = self._bytes(token_id)
            self._cache[token_id] = (data.decode("utf-8", errors="replace"), data)
        return self._cache[token_id]

    def _bytes(self, token_id: int) -> bytes:
        if self.byte_level:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            alphabet = _byte_level_alphabet()
            if isinstance(piece, str) and piece and all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
        return self.tokenizer.decode([token_id]).encode()


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    return "ByteLevel" in json.dumps(json.loads(backend.to_str()).get("decoder"))


# -- logprobs -----------------------------------------------------------------------------
def chat_logprobs(texts: TokenTexts, token_lps: list, top_lps: list) -> dict[str, Any]:
    """{"content": [{token, logprob, bytes, top_logprobs}]} from the engine's
    (logprob, id, _) entries."""
    content = []
    for (lp, tid, _), tops in zip(token_lps, top_lps, strict=True):
        entry = _chat_entry(texts, lp, tid)
        entry["top_logprobs"] = [_chat_entry(texts, t_lp, t_id) for t_lp, t_id, _ in tops or []]
        content.append(entry)
    return {"content": content}


def _chat_entry(texts: TokenTexts, lp: float, tid: int) -> dict[str, Any]:
    text, data = texts.get(tid)
    return {"token": text, "logprob": translate.clamp_logprob(lp), "bytes": list(data)}


def completion_logprobs(
    texts: TokenTexts, token_lps: list, top_lps: list, offset: int
) -> tuple[dict[str, Any], int]:
    """The legacy {tokens, token_logprobs, top_logprobs, text_offset} shape, with offsets
    counted from `offset` (characters of the choice's text before these tokens); returns it
    and the offset after them."""
    out: dict[str, list] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for (lp, tid, _), tops in zip(token_lps, top_lps, strict=True):
        text = texts.get(tid)[0]
        out["tokens"].append(text)
        out["token_logprobs"].append(translate.clamp_logprob(lp))
        out["top_logprobs"].append(
            None
            if tops is None
            else {texts.get(t_id)[0]: translate.clamp_logprob(t_lp) for t_lp, t_id, _ in tops}
        )
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


def completion_entries(meta: dict[str, Any], echo: bool) -> tuple[list, list]:
    """(token logprobs, top logprobs) of a finished completion: the prompt's first with echo."""
    tokens, tops = meta["output_token_logprobs"], meta["output_top_logprobs"]
    if echo:
        tokens = meta["input_token_logprobs"] + tokens
        tops = meta["input_top_logprobs"] + tops
    return tokens, tops


# -- streams ------------------------------------------------------------------------------
class _Progress:
    """Per output: how many logprob entries were sent, the text offset, the last meta_info."""

    def __init__(self, count: int) -> None:
        self.sent_in = [0] * count
        self.sent_out = [0] * count
        self.offset = [0] * count
        self.metas: list[dict[str, Any]] = [{} for _ in range(count)]

    def new_entries(self, i: int, meta: dict[str, Any], prompt: bool) -> tuple[list, list]:
        """The logprob entries of output i not sent yet (the prompt's first, if asked)."""
        tokens, tops = [], []
        if prompt:
            tokens += meta["input_token_logprobs"][self.sent_in[i] :]
            tops += meta["input_top_logprobs"][self.sent_in[i] :]
            self.sent_in[i] = len(meta["input_token_logprobs"])
        tokens += meta["output_token_logprobs"][self.sent_out[i] :]
        tops += meta["output_top_logprobs"][self.sent_out[i] :]
        self.sent_out[i] = len(meta["output_token_logprobs"])
        return tokens, tops


def _chunk_maker(job: Any, obj: str):
    base = {"id": job.id, "object": obj, "created": job.created, "model": job.model}
    with_usage = bool(job.req.stream_options and job.req.stream_options.include_usage)

    def make(choices: list[dict[str, Any]], usage: dict | None = None) -> dict[str, Any]:
        chunk = {**base, "choices": choices}
        if with_usage:  # OpenAI: null on every chunk but the last one
            chunk["usage"] = usage
        return chunk

    return make, with_usage


async def chat_events(
    job: Any,
    chunks: Chunks,
    texts: TokenTexts,
) -> AsyncIterator[dict[str, Any]]:
    """chat.completion.chunk events: a role delta per choice, content deltas, a final delta
    with finish_reason per choice, then (include_usage) one chunk with usage and no choices."""
    make, with_usage = _chunk_maker(job, "chat.completion.chunk")
    count = job.req.n
    progress = _Progress(count)
    deltas = [ChoiceDeltas(job.tools) for _ in range(count)]
    async with aclosing(chunks):  # closing it aborts a request the client left
        for i in range(count):
            yield make([_chat_choice(i, deltas[i].role_delta())])
        async for chunk in chunks:
            i, meta = chunk.get("index", 0), chunk["meta_info"]
            logprobs = None
            if job.req.logprobs:
                entries = progress.new_entries(i, meta, prompt=False)
                logprobs = chat_logprobs(texts, *entries) if entries[0] else None
            for delta in deltas[i].feed(chunk["text"], logprobs is not None):
                yield make([_chat_choice(i, delta, logprobs)])
                logprobs = None
            if meta["finish_reason"] is not None:
                for delta in deltas[i].finish():
                    yield make([_chat_choice(i, delta)])
                yield make([_chat_choice(i, {}, None, meta, deltas[i].has_calls)])
            progress.metas[i] = meta
    if with_usage:
        yield make([], translate.usage(progress.metas, job.req.n))


def _chat_choice(
    i: int,
    delta: dict[str, Any],
    logprobs: dict | None = None,
    meta: dict[str, Any] | None = None,
    calls: bool = False,
) -> dict[str, Any]:
    # reasoning_content: SGLang's delta field, null where reasoning is not separated.
    delta = {**delta, "reasoning_content": None}
    choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": None}
    if meta is not None:
        choice["finish_reason"] = translate.finish_reason(meta, calls)
        choice["matched_stop"] = translate.matched_stop(meta)
    return choice


class ChoiceDeltas:
    """The chat deltas of one streamed choice, from its text deltas, by the tool plan:
    content; one call's argument text (named); calls read as they grow (required); or, for
    "auto", content until a call may have begun, then the parsed rest at the end."""

    def __init__(self, plan: ToolPlan | None) -> None:
        self.mode = "plain" if plan is None or plan.mode == "none" else plan.mode
        # The function a "named" plan calls; the call parser of "required" or "auto".
        self.named = plan.function_name if plan is not None and self.mode == "named" else ""
        self.scanner = ForcedCallScanner() if self.mode == "required" else None
        self.auto = AutoToolStream(plan.names) if plan is not None and self.mode == "auto" else None
        self.ids: list[str] = []  # ids of the calls begun

    @property
    def has_calls(self) -> bool:
        return bool(self.ids)

    def role_delta(self) -> dict[str, Any]:
        forced = self.mode in ("named", "required")
        return {"role": "assistant", "content": None if forced else ""}

    def feed(self, text: str, logprobs: bool = False) -> list[dict[str, Any]]:
        """The deltas for new text; one empty delta if there are none but logprobs to send."""
        if self.mode == "plain":
            return [{"content": text}] if text or logprobs else []
        out = self._tool_deltas(text)
        return out or ([{}] if logprobs else [])

    def _tool_deltas(self, text: str) -> list[dict[str, Any]]:
        if self.mode == "named":
            out = [] if self.ids else [self._start(self.named)]
            return out + ([_args_delta(0, text)] if text else [])
        if self.scanner is not None:  # "required"
            return [
                self._start(ev[2]) if ev[0] == "start" else _args_delta(ev[1], ev[2])
                for ev in self.scanner.feed(text)
            ]
        assert self.auto is not None, "the mode left is auto"
        sent = self.auto.feed(text)
        return [{"content": sent}] if sent else []

    def _start(self, name: str, arguments: str = "") -> dict[str, Any]:
        self.ids.append(new_call_id())
        call = ToolCall(name, arguments, self.ids[-1]).to_openai()
        return {"tool_calls": [{"index": len(self.ids) - 1, **call}]}

    def finish(self) -> list[dict[str, Any]]:
        """The deltas held back to the end (auto), or the call header of an empty output."""
        if self.mode == "named" and not self.ids:
            return [self._start(self.named)]
        if self.auto is None:  # not "auto"
            return []
        parsed = self.auto.finish()
        out = [{"content": parsed.content}] if parsed.content else []
        return out + [self._start(c.name, c.arguments) for c in parsed.calls]


def _args_delta(index: int, text: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "function": {"arguments": text}}]}


async def completion_events(
    job: Any,
    chunks: Chunks,
    texts: TokenTexts,
) -> AsyncIterator[dict[str, Any]]:
    """text_completion chunks, one per engine update of a choice (as SGLang streams them):
    the first one starts with the prompt (echo) and carries its logprobs; the last one carries
    finish_reason with the last tokens' logprobs; then usage (include_usage)."""
    make, with_usage = _chunk_maker(job, "text_completion")
    req = job.req
    count = req.n * len(job.ids)
    progress = _Progress(count)
    started = [False] * count
    async with aclosing(chunks):  # closing it aborts a request the client left
        async for chunk in chunks:
            i, meta = chunk.get("index", 0), chunk["meta_info"]
            text = chunk["text"]
            if req.echo and not started[i]:
                text = job.prompt_texts[i // req.n] + text
            logprobs = None
            if req.logprobs is not None:
                entries = progress.new_entries(i, meta, prompt=bool(req.echo))
                if entries[0]:
                    logprobs, progress.offset[i] = completion_logprobs(
                        texts, *entries, progress.offset[i]
                    )
            done = meta["finish_reason"] is not None
            if text or logprobs or done:
                yield make([_text_choice(i, text, logprobs, meta if done else None)])
                started[i] = True
            progress.metas[i] = meta
    if with_usage:
        yield make([], translate.usage(progress.metas, req.n))


def _text_choice(
    i: int, text: str, logprobs: dict | None = None, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": None}
    if meta is not None:
        choice["finish_reason"] = translate.finish_reason(meta)
        choice["matched_stop"] = translate.matched_stop(meta)
    return choice
