"""The interface a DSL backend implements, and what every backend shares on top of it.

A backend needs two primitives with Engine.generate's contract, `_generate` and
`_generate_stream`, plus its chat template; prefix caching and `select`'s scoring are built here
from them, so the in-process, endpoint and local-server backends behave the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from radixrt.lang.chat_template import ChatTemplate
from radixrt.lang.choices import METHODS, decide, mean_logprob
from radixrt.lang.speculative import TokenUsage


@dataclass
class ChoiceDecision:
    index: int
    meta_info: dict[str, Any]
    requests: list[dict[str, Any]] = field(default_factory=list)  # the meta_info of each call


class Backend:
    """Contract: methods are thread-safe (programs and forks call them from worker threads)."""

    def _generate(self, **request: Any) -> Any:
        """Engine.generate's arguments (text=..., not prompt=...) and result."""
        raise NotImplementedError

    def _generate_stream(self, **request: Any) -> Iterator[dict[str, Any]]:
        """Chunks whose "text" is the new text; the last one carries the final meta_info."""
        raise NotImplementedError

    def get_chat_template(self) -> ChatTemplate:
        raise NotImplementedError

    def flush_cache(self) -> bool:
        raise NotImplementedError

    def get_server_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Release what the backend holds (sockets, a server it started)."""

    def model_path(self) -> str | None:
        """The served model's path (what picks a reasoning format); None if unknown."""
        return None

    def uncache_prefix(self, rid: str | None = None) -> None:
        """A no-op, as SGLang's: cached prefixes are evicted by the radix cache (LRU)."""

    @property
    def token_usage(self) -> TokenUsage:
        """The tokens of every gen's request so far (SGLang's backend.token_usage)."""
        if "_token_usage" not in self.__dict__:
            self.__dict__.setdefault("_token_usage", TokenUsage())
        return self.__dict__["_token_usage"]

    # -- built on the primitives --------------------------------------------------------------
    def generate(self, text: str, sampling_params: dict[str, Any], **logprob_options: Any) -> Any:
        result = self._generate(text=text, sampling_params=sampling_params, **logprob_options)
        for r in result if isinstance(result, list) else [result]:
            self.token_usage.add(r.get("meta_info") or {})
        return result

    def generate_stream(
        self, text: str, sampling_params: dict[str, Any], **logprob_options: Any
    ) -> Iterator[dict[str, Any]]:
        meta = None
        for chunk in self._generate_stream(
            text=text, sampling_params=sampling_params, **logprob_options
        ):
            meta = chunk.get("meta_info") or meta
            yield chunk
        self.token_usage.add(meta or {})

    def cache_prefix(self, text: str) -> dict[str, Any]:
        """Prefill `text` into the radix cache without generating; its meta_info."""
        return self._generate(text=text, sampling_params={"max_new_tokens": 0})["meta_info"]

    def select(
        self, text: str, choices: list[str], temperature: float, choices_method: str
    ) -> ChoiceDecision:
        """Score every choice as a continuation of `text`. The prefix is prefilled once; then
        one batched request (the prefix and each prefix + choice, no generation) returns the
        prompt logprobs of the choices' tokens, each computed over the cached prefix."""
        if not text:
            raise ValueError(
                "select: there must be text before it (choices are scored as its continuation)"
            )
        method = METHODS[choices_method]
        head = self.cache_prefix(text)
        start = max(head["prompt_tokens"] - 1, 0)  # from the prefix's last token
        results = self._generate(
            text=[text] + [text + c for c in choices],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=start,
        )
        last_prefix = results[0]["meta_info"]["input_token_logprobs"]
        tokens = [
            _choice_tokens(r["meta_info"]["input_token_logprobs"], last_prefix) for r in results[1:]
        ]
        conditional = [[lp for lp, _, _ in t] for t in tokens]
        requests = [head] + [r["meta_info"] for r in results]
        unconditional = None
        if method.requires_unconditional_logprobs:
            # "Unconditional": each choice's tokens scored alone, with no context (as SGLang).
            plain = self._generate(
                input_ids=[[tid for _, tid, _ in t] for t in tokens],
                sampling_params={"max_new_tokens": 0},
                return_logprob=True,
                logprob_start_len=0,
            )
            unconditional = [
                [lp for lp, _, _ in r["meta_info"]["input_token_logprobs"]] for r in plain
            ]
            requests += [r["meta_info"] for r in plain]
        scores = method.scores(conditional, unconditional)
        index = decide(scores, temperature)
        meta = {
            "choices_method": method.name,
            "scores": scores,
            "normalized_prompt_logprobs": [mean_logprob(c) for c in conditional],
            "input_token_logprobs": tokens,
            "unconditional_token_logprobs": unconditional,
            "prompt_tokens": sum(r["prompt_tokens"] for r in requests),
            "cached_tokens": sum(r["cached_tokens"] for r in requests),
        }
        return ChoiceDecision(index, meta, requests)

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _choice_tokens(triples: list, last_prefix: list) -> list[tuple]:
    """The choice's own tokens out of logprobs that start at the prefix's last token. If the
    tokenizer merged that token with the choice's start, the merged token belongs to it."""
    prefix_last_id = last_prefix[0][1]
    if triples and triples[0][1] == prefix_last_id and len(triples) > 1:
        return [tuple(t) for t in triples[1:]]
    return [tuple(t) for t in triples]
