"""KV-cache utilisation scorer: 1 − vllm:kv_cache_usage_perc (more free KV scores higher).

Owns the formula; never reads a stale scrape (unknown scores 0, never "empty cache").
"""

from __future__ import annotations

from loom_router.core.scorers.contract import ScoringContext, clamp


def score(ctx: ScoringContext) -> dict[str, float]:
    fresh = ctx.load.fresh.get
    out: dict[str, float] = {}
    for c in ctx.candidates:
        m = fresh(c)
        out[c] = 0.0 if m is None or m.kv_usage is None else clamp(1.0 - m.kv_usage)
    return out
