"""Queue scorer: fewer waiting requests (vllm:num_requests_waiting) scores higher.

Owns the scaling across candidates; never reads a stale scrape (an unknown endpoint
counts as the fleet mean).
"""

from __future__ import annotations

from loom_router.core.scorers.contract import ScoringContext, fewer_is_better


def score(ctx: ScoringContext) -> dict[str, float]:
    return fewer_is_better(ctx, "waiting")
