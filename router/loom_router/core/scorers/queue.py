"""Queue scorer: fewer waiting requests (vllm:num_requests_waiting) scores higher.

Owns the scaling across candidates; never reads a stale scrape (an unknown endpoint
counts as the fleet mean).
"""

from __future__ import annotations

from loom_router.core.scorers.contract import ScoringContext, lower_is_better


def score(ctx: ScoringContext) -> dict[str, float]:
    fresh = ctx.load.fresh.get
    values: dict[str, float] = {}
    for c in ctx.candidates:
        m = fresh(c)
        if m is not None and m.waiting is not None:
            values[c] = m.waiting
    return lower_is_better(ctx.candidates, values)
