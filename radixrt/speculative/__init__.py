"""Speculative decoding without a draft model: where drafts come from (prompt lookup; the
radix cache's continuation is asked of the cache) and how many are worth verifying
(adaptive.py). The scheduler glues them to its requests (scheduler/speculation.py)."""
