"""In-flight scorer: fewer requests this router has open on the endpoint scores higher.

Owns the scaling across candidates; the count is the router's own, so it is never stale.
"""

from __future__ import annotations

from loom_router.core.scorers.contract import ScoringContext, lower_is_better


def score(ctx: ScoringContext) -> dict[str, float]:
    own = ctx.load.in_flight.get
    counts = {c: float(own(c, 0)) for c in ctx.candidates}
    return lower_is_better(ctx.candidates, counts)
