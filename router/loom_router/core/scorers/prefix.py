"""Prefix-cache scorer: the longest consecutive cached prefix / the prompt's full blocks.

Owns the formula for both indexes (precise: engine block hashes; approximate: text blocks);
never looks blocks up itself (the pipeline matches once and shares the result).
"""

from __future__ import annotations

from loom_router.core.scorers.contract import ScoringContext, clamp


def score(ctx: ScoringContext) -> dict[str, float]:
    if ctx.total_blocks <= 0:
        return dict.fromkeys(ctx.candidates, 0.0)
    return {c: clamp(ctx.prefix_blocks.get(c, 0) / ctx.total_blocks) for c in ctx.candidates}


approximate_score = score
"""The approximate scorer is the same ratio over text blocks the router sent to each endpoint."""
