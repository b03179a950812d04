"""What the scheduler process counts, in one object: the loop's counters, the planner's
preemptions, structured generation's jump-forward tokens and compile times, the output
processor's failures. (The prefix cache's block timings stay the cache's: it observes its own
nodes into them.)

`SchedulerStats.to_dict` is what get_stats() ships to the frontend (/metrics, /v1/loads,
/server_info and the dashboard read it): its keys and their order are that contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixrt.cache.block_timings import KVBlockTimings
from radixrt.observability.histogram import FixedHistogram

# vLLM's iteration_tokens_total buckets (powers of two up to a large prefill step).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Grammar compile: a cache hit is instant, a large JSON schema takes seconds.
# Tokens a speculative verification yields (kept drafts and the token after them).
ACCEPT_LENGTH_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
COMPILE_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass(frozen=True)
class Gauges:
    """What the scheduler holds at the moment it is asked (read off its parts, not counted)."""

    grammar_queue: int  # constrained requests whose grammar is compiling
    running: int
    queued: int
    pool_tokens: int
    free_tokens: int
    evictable_tokens: int
    protected_tokens: int
    beam_groups: int = 0  # beam-search groups running
    disagg_queue: int = 0  # requests waiting on a KV transfer (prefill/decode disaggregation)


@dataclass
class SchedulerStats:
    """Counters since start-up; each is incremented in one place, by the part that sees it."""

    prompt_tokens: int = 0  # of requests accepted (before any grammar compile)
    cached_tokens: int = 0  # prompt tokens the cache served, counted when a request ends
    generated_tokens: int = 0  # output tokens, counted when a request ends
    steps: int = 0
    requests: int = 0  # accepted
    decode_tokens: int = 0  # decode rows computed (the log line's throughput; not shipped)
    num_preemptions: int = 0  # requests retracted to free KV
    jump_forward_tokens: int = 0  # proposed tokens the model confirmed
    failed_requests: int = 0  # requests ended by a failure of their own
    # Speculative decoding: drafted tokens the model checked, and those it kept (vLLM's
    # spec_decode_num_draft_tokens / num_accepted_tokens).
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    # Beam search: beams forked, and at those forks the positions shared through the prefix
    # cache and those copied (a partial page, copy on write).
    beam_forks: int = 0
    beam_shared_tokens: int = 0
    beam_copied_tokens: int = 0
    # Prefill/decode disaggregation: transfers done and failed (timed out, refused, peer
    # gone), what they moved and the time this side spent moving it (gathering and queueing
    # the pages on a prefill server, receiving and storing them on a decode server), and the
    # prompt tokens a decode server already held in its cache and did not ask for.
    disagg_transfers: int = 0
    disagg_transfer_failures: int = 0
    disagg_transfer_tokens: int = 0
    disagg_transfer_bytes: int = 0
    disagg_transfer_seconds: float = 0.0
    disagg_reused_tokens: int = 0
    # Prefix-cache lookups in tokens at each request's admission (queried: its prompt).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    iteration_tokens: FixedHistogram = field(
        default_factory=lambda: FixedHistogram(ITERATION_TOKEN_BUCKETS)
    )
    # Tokens each speculative verification yielded (SGLang's spec_accept_length).
    spec_accept_length: FixedHistogram = field(
        default_factory=lambda: FixedHistogram(ACCEPT_LENGTH_BUCKETS)
    )
    # How long each constrained request waited for its grammar (a cache hit: ~0).
    grammar_compile_time: FixedHistogram = field(
        default_factory=lambda: FixedHistogram(COMPILE_SECONDS_BUCKETS)
    )

    def accepted(self, prompt_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prefix_cache_queries += prompt_tokens
        self.prefix_cache_hits += cached_tokens

    def finished(self, generated_tokens: int, cached_tokens: int) -> None:
        self.generated_tokens += generated_tokens
        self.cached_tokens += cached_tokens

    def spec_verified(self, drafted: int, kept: int) -> None:
        self.spec_draft_tokens += drafted
        self.spec_accepted_tokens += kept
        self.spec_accept_length.observe(kept + 1)

    @property
    def kept_drafts(self) -> int:
        """Drafted tokens the model confirmed: speculation's and jump-forward's."""
        return self.spec_accepted_tokens + self.jump_forward_tokens

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / max(self.prompt_tokens, 1)

    def to_dict(self, now: Gauges, timings: KVBlockTimings) -> dict[str, Any]:
        """get_stats()'s reply, with the cache's block `timings`. `requests` appears once one
        was accepted (as it always has)."""
        counted: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "steps": self.steps,
        }
        if self.requests:
            counted["requests"] = self.requests
        return {
            **counted,
            "num_preemptions": self.num_preemptions,
            "jump_forward_tokens": self.jump_forward_tokens,
            "failed_requests": self.failed_requests,
            "spec_draft_tokens": self.spec_draft_tokens,
            "spec_accepted_tokens": self.spec_accepted_tokens,
            "beam_groups": now.beam_groups,
            "beam_forks": self.beam_forks,
            "beam_shared_tokens": self.beam_shared_tokens,
            "beam_copied_tokens": self.beam_copied_tokens,
            "disagg_queue": now.disagg_queue,
            "disagg_transfers": self.disagg_transfers,
            "disagg_transfer_failures": self.disagg_transfer_failures,
            "disagg_transfer_tokens": self.disagg_transfer_tokens,
            "disagg_transfer_bytes": self.disagg_transfer_bytes,
            "disagg_transfer_seconds": self.disagg_transfer_seconds,
            "disagg_reused_tokens": self.disagg_reused_tokens,
            "grammar_queue": now.grammar_queue,
            "cache_hit_rate": self.cache_hit_rate,
            "running": now.running,
            "queued": now.queued,
            "pool_tokens": now.pool_tokens,
            "free_tokens": now.free_tokens,
            "evictable_tokens": now.evictable_tokens,
            "protected_tokens": now.protected_tokens,
            "evicted_tokens": timings.evicted_tokens,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            # Bucket counts for the frontend's Prometheus histograms (histogram.py).
            "histograms": {
                "iteration_tokens_total": self.iteration_tokens.snapshot(),
                "grammar_compile_time_seconds": self.grammar_compile_time.snapshot(),
                "spec_accept_length": self.spec_accept_length.snapshot(),
                **timings.snapshot(),
            },
        }
