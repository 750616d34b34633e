"""The P/D decider: prefill remotely or let the decode endpoint prefill the prompt itself.

Owns the rule and its reason (pure); never picks the prefill endpoint (the pipeline does) and
never pairs endpoints of different weights versions.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom_router.core.endpoints import Endpoint


@dataclass(frozen=True)
class PDDecision:
    """Whether to disaggregate, why (always said), and the numbers it was decided on."""

    disaggregate: bool
    reason: str
    prompt_tokens: int
    cached_tokens: int

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


def cached_tokens(matched_blocks: int, tokens_per_block: int, prompt_tokens: int) -> int:
    """Prompt tokens the endpoint will reuse: whole blocks, and never the last prompt token
    (an engine always computes at least one token to produce logits)."""
    usable_blocks = max(prompt_tokens - 1, 0) // tokens_per_block if tokens_per_block > 0 else 0
    return min(matched_blocks, usable_blocks) * max(tokens_per_block, 0)


def decide(
    endpoint: Endpoint,
    prompt_tokens: int,
    cached: int,
    min_uncached_tokens: int,
    prefill_available: bool,
) -> PDDecision:
    """Disaggregate iff `endpoint` is a decode endpoint, the tokens it lacks are at least
    `min_uncached_tokens`, and a prefill endpoint on its weights version can take the prompt.
    """
    uncached = max(0, prompt_tokens - cached)

    def no(reason: str) -> PDDecision:
        return PDDecision(False, reason, prompt_tokens, cached)

    if endpoint.role == "aggregated":
        return no("aggregated endpoint: prefills and decodes itself")
    if endpoint.role != "decode":
        return no(f"{endpoint.role} endpoint cannot decode")
    if uncached < min_uncached_tokens:
        return no(
            f"{uncached} uncached tokens < minUncachedTokens {min_uncached_tokens}: "
            "decode prefills locally"
        )
    if not prefill_available:
        return no(
            f"{uncached} uncached tokens but no prefill endpoint can take it on weights "
            f"version {endpoint.weights_version}: decode prefills locally"
        )
    return PDDecision(
        True,
        f"{uncached} uncached tokens >= minUncachedTokens {min_uncached_tokens}: "
        f"prefill remotely on weights version {endpoint.weights_version}",
        prompt_tokens,
        cached,
    )
