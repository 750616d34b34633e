"""The kv_cache_utilization scorer (card: scorers.kvCacheUtilization): 1 −
vllm:kv_cache_usage_perc (more free KV scores higher).

Owns the formula; never reads a stale scrape: an unknown endpoint counts as the fleet mean,
never as an empty cache.
"""

from __future__ import annotations

from loom_router.core.scorers.contract import ScoringContext, clamp, with_fleet_mean


def score(ctx: ScoringContext) -> dict[str, float]:
    fresh = ctx.load.fresh.get
    usage: dict[str, float] = {}
    for c in ctx.candidates:
        m = fresh(c)
        if m is not None and m.kv_usage is not None:
            usage[c] = m.kv_usage
    usage = with_fleet_mean(ctx.candidates, usage)
    return {c: clamp(1.0 - usage[c]) if c in usage else 0.0 for c in ctx.candidates}
