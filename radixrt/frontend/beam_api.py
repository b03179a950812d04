"""vLLM's offline beam search, `LLM.beam_search(prompts, BeamSearchParams(...))`, over the
engine's own beam groups (scheduler/beam_search.py): the same parameter and output names, so
code written for vLLM runs unchanged. The beams are ranked as transformers ranks them
(docs/beam_search.md says where that differs from vLLM's own ranking)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixrt.errors import ParamError


@dataclass
class BeamSearchParams:
    """vLLM's fields. temperature: beams are ranked by the model's log-probabilities, so 0
    (vLLM's default) or 1 only; include_stop_str_in_output keeps a stop string in `text`."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False


@dataclass
class BeamSearchSequence:
    """One returned beam. `tokens` holds the prompt's ids, then the generated ones (as
    vLLM's); `text` the generated text; `cum_logprob` the sum of the generated tokens'
    log-probabilities; `score` the length-penalized score it was ranked by."""

    tokens: list[int]
    logprobs: list[Any] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    score: float = 0.0


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


def prompt_fields(prompt: Any) -> dict[str, Any]:
    """vLLM's prompt forms as generate() fields: a str, {"prompt": str} or
    {"prompt_token_ids": [...]}."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt_token_ids"), list):
        return {"input_ids": list(prompt["prompt_token_ids"])}
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
        return {"prompt": prompt["prompt"]}
    raise ParamError(
        "prompts",
        "each prompt must be a str, {'prompt': str} or {'prompt_token_ids': [int, ...]}",
    )


def sampling_params(params: BeamSearchParams) -> dict[str, Any]:
    """The engine's sampling_params for `params`: all beam_width beams are returned."""
    return {
        "beam_width": params.beam_width,
        "n": params.beam_width,
        "max_new_tokens": params.max_tokens,
        "ignore_eos": params.ignore_eos,
        "temperature": params.temperature,
        "length_penalty": params.length_penalty,
        "no_stop_trim": params.include_stop_str_in_output,
    }


def to_output(prompt_ids: list[int], results: list[dict[str, Any]]) -> BeamSearchOutput:
    """generate()'s n result dicts of one prompt as vLLM's BeamSearchOutput."""
    sequences = []
    for result in results:
        meta = result["meta_info"]
        reason = meta.get("finish_reason") or {}
        matched = reason.get("matched")
        score = meta.get("beam_score", 0.0)
        sequences.append(
            BeamSearchSequence(
                tokens=[*prompt_ids, *result["output_ids"]],
                cum_logprob=meta.get("beam_cum_logprob", score),
                text=result["text"],
                finish_reason=reason.get("type"),
                stop_reason=matched if isinstance(matched, (int, str)) else None,
                score=score,
            )
        )
    return BeamSearchOutput(sequences)


def beam_search(
    engine: Any, prompts: list[Any], params: Any, **_vllm_only: Any
) -> list[BeamSearchOutput]:
    """Engine.beam_search, vLLM's LLM.beam_search: each prompt (a str, {"prompt": str} or
    {"prompt_token_ids": [...]}) searched with `params` (BeamSearchParams or vLLM's own, same
    fields); one BeamSearchOutput per prompt, its beam_width sequences best first. vLLM's
    lora_request, use_tqdm and concurrency_limit are ignored. The prompts go in one call (the
    groups run together), or one call each when they mix text and ids."""
    fields = [prompt_fields(p) for p in prompts]
    kinds = {key for f in fields for key in f}
    if not fields:
        return []
    if len(kinds) > 1:
        return [beam_search(engine, [p], params)[0] for p in prompts]
    key, n = kinds.pop(), params.beam_width
    results = engine.generate(
        sampling_params=sampling_params(params),
        return_prompt_token_ids=True,
        **{key: [f[key] for f in fields]},
    )
    groups = [results[i * n : i * n + n] for i in range(len(prompts))]
    return [to_output(g[0]["prompt_token_ids"], g) for g in groups]
