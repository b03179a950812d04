"""Incremental detokenization: turn a growing list of token ids into text deltas that are safe
to show: no split UTF-8 character, no stop string, not even the start of one. `Detokenizer` and
`serve` are the detokenizer between the scheduler and the frontend, the one place that turns
ids into text: its own process (radixrt/detokenizer/process.py) or, in an in-process
engine, a thread (radixrt/frontend/in_process.py).

Stop regexes (SGLang's stop_regex) are held back the same way: text from where a match could
still begin is not shown (the `regex` module's partial matching). The final text ends before
the first match, or after it with no_stop_trim. Every regex search runs under a time limit: a
pattern that backtracks catastrophically is given up for its request (the scheduler, which
searches the same output, ends that request) rather than stalling every other stream.

Ids become text through detokenizer/decode_stream.py: the `tokenizers` package's DecodeStream for
fast tokenizers, the tokenizer's own decode over a short window of ids otherwise; either way a
long output costs O(length) in all, not O(length^2), and no split character is shown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import regex  # partial matching (is this text the start of a match?) and search time limits

from radixrt.detokenizer.decode_stream import TextDecoder, new_decoder
from radixrt.ipc.transport import Transport
from radixrt.protocol.messages import (
    BatchOutput,
    DetokParams,
    ReqOutput,
    SchedulerFailed,
    decode_from_scheduler,
    encode,
)

logger = logging.getLogger("radixrt.detokenizer")  # kept across moves
REGEX_TIMEOUT_S = 0.05  # per search; real stop patterns take microseconds
STOP_POLL_S = 0.1  # how often an idle detokenizer thread checks whether to stop


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop: list[str] | None = None,
        no_stop_trim: bool = False,
        stop_regex: list[str] | None = None,
        decoder: TextDecoder | None = None,
    ) -> None:
        """`decoder` (default: chosen by `new_decoder`) turns the ids into text."""
        self.decoder = decoder or new_decoder(
            tokenizer, skip_special_tokens, spaces_between_special_tokens
        )
        self.stop = stop or []
        self.max_stop = max((len(s) for s in self.stop), default=0)
        self.no_stop_trim = no_stop_trim
        self.stop_regex = [regex.compile(p) for p in stop_regex or []]
        # Without stop strings or regexes nothing is held back: the decoder's text is the delta.
        self.plain = not self.stop and not self.stop_regex
        self.text = ""  # the output's text so far, whole characters only (not kept if plain)
        self.sent = 0  # characters of text already handed out

    def add(self, new_ids: list[int]) -> str:
        """Take new ids; return the text delta that can be shown now."""
        new = self.decoder.push(new_ids)
        if self.plain:
            return new
        self.text += new
        text = self._cut_at_regex(self._cut_at_stop(self.text))
        held = min(len(text) - self._partial_stop_len(text), self._partial_regex_start(text))
        return self._delta(text[:held])

    def finish(self, new_ids: list[int], finish_reason: dict | None) -> str:
        """Take the request's last ids (instead of `add`); return the final text delta."""
        matched = (finish_reason or {}).get("matched")
        if (
            isinstance(matched, int)
            and not self.no_stop_trim
            and new_ids
            and new_ids[-1] == matched
        ):
            new_ids = new_ids[:-1]  # the stop token's own text is not part of the output
        new = self.decoder.push(new_ids) + self.decoder.flush()
        if self.plain:
            return new
        self.text += new
        text = self._cut_at_stop(self.text, keep_stop=self.no_stop_trim)
        return self._delta(self._cut_at_regex(text, keep_stop=self.no_stop_trim))

    def _cut_at_stop(self, text: str, keep_stop: bool = False) -> str:
        # A stop string cannot start in text sent already (it would have been held back).
        start = max(self.sent - self.max_stop, 0)
        cut = len(text)
        for s in self.stop:
            i = text.find(s, start)
            if i != -1:
                cut = min(cut, i + (len(s) if keep_stop else 0))
        return text[:cut]

    def _cut_at_regex(self, text: str, keep_stop: bool = False) -> str:
        """text up to the first match of any stop regex (through it with keep_stop)."""
        cut = len(text)
        for rx in list(self.stop_regex):
            m = self._search(rx, text)
            if m is not None:
                cut = min(cut, m.end() if keep_stop else m.start())
        return text[:cut]

    def _partial_regex_start(self, text: str) -> int:
        """Where the earliest text that could still grow into a stop-regex match begins."""
        start = len(text)
        for rx in list(self.stop_regex):
            m = self._search(rx, text, self.sent, partial=True)
            if m is not None:
                start = min(start, m.start())
        return start

    def _search(self, rx: regex.Pattern, text: str, pos: int = 0, partial: bool = False):
        try:
            return rx.search(text, pos, partial=partial, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            logger.warning(
                "stop_regex %r took over %g s to search: no longer applied to this request",
                rx.pattern,
                REGEX_TIMEOUT_S,
            )
            self.stop_regex.remove(rx)
            return None

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest tail of text that is the start of some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _delta(self, text: str) -> str:
        if len(text) < self.sent:  # can happen when a token merges with the next one
            return ""
        delta = text[self.sent :]
        self.sent = len(text)
        return delta


class Detokenizer:
    """Per-request incremental state, created at a request's first output (which carries its
    DetokParams), dropped at its last. Without a tokenizer (skip_tokenizer_init) messages pass
    unchanged: the frontend gets ids only."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}

    def fill(self, out: ReqOutput) -> None:
        """Set `out.text` to the request's new text."""
        state = self.states.get(out.rid)
        if state is None:
            p = out.detok or DetokParams()
            state = IncrementalDetokenizer(
                self.tokenizer,
                p.skip_special_tokens,
                p.spaces_between_special_tokens,
                p.stop,
                p.no_stop_trim,
                p.stop_regex,
            )
            self.states[out.rid] = state
        if out.finished:
            out.text = state.finish(out.new_output_ids, out.finish_reason)
            del self.states[out.rid]
        else:
            out.text = state.add(out.new_output_ids)

    def process(self, data: bytes) -> bytes:
        """One message from the scheduler → the message for the frontend."""
        if self.tokenizer is None:
            return data
        msg = decode_from_scheduler(data)
        if not isinstance(msg, BatchOutput):
            return data  # control replies and failures go on as they are
        for out in msg.outputs:
            self.fill(out)
        return encode(msg)


def serve(
    transport: Transport, detok: Detokenizer, stopped: Callable[[], bool] | None = None
) -> None:
    """Forward every message from the scheduler to the frontend, its text filled in, until
    `stopped()` says so (asked when nothing is pending, so what the scheduler sent last still
    goes out; None: forever). Raises what went wrong; the caller reports it (`failure`)."""
    while True:
        items = transport.recv(timeout=None if stopped is None else STOP_POLL_S)
        if not items and stopped is not None and stopped():
            return
        for data in items:
            transport.send(detok.process(data))


def failure(error: BaseException) -> bytes:
    """The message that tells the frontend the detokenizer died, and why."""
    return encode(SchedulerFailed(f"the detokenizer failed: {error}", type(error).__name__))
