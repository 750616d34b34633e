"""Prefix-cache scorer: the longest consecutive cached prefix / the prompt's full blocks, a block
only a host tier holds counting `host_hit_weight` of a device-resident one (it costs a reload).

Owns the formula for both indexes (precise: engine block hashes; approximate: text blocks);
never looks blocks up itself (the pipeline matches once and shares the result).
"""

from __future__ import annotations

from loom_router.core.scorers.contract import ScoringContext, clamp


def score(ctx: ScoringContext) -> dict[str, float]:
    if ctx.total_blocks <= 0:
        return dict.fromkeys(ctx.candidates, 0.0)
    discount = 1.0 - ctx.host_hit_weight
    out: dict[str, float] = {}
    for c in ctx.candidates:
        blocks = ctx.prefix_blocks.get(c, 0)
        host = min(ctx.host_blocks.get(c, 0), blocks)  # a hot endpoint's blocks are already 0
        out[c] = clamp((blocks - discount * host) / ctx.total_blocks)
    return out


approximate_score = score
"""The approximate scorer is the same ratio over text blocks the router sent to each endpoint."""
