"""Picks one endpoint from scores: the maximum with a random tie-break, or weighted random.

Owns the choice only; the random generator is passed in (seeded by the caller, never global),
and candidates are visited in sorted order so equal inputs and seeds give equal picks.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from loom_router.errors import NoEndpointError

TIE_TOLERANCE = 1e-9


def pick_max(
    scores: Mapping[str, float], rng: random.Random, tolerance: float = TIE_TOLERANCE
) -> str:
    """The highest-scoring id; among ids within `tolerance` of the best, a random one."""
    if not scores:
        raise NoEndpointError("no candidate to pick from")
    best = max(scores.values())
    tied = sorted(c for c, s in scores.items() if s >= best - tolerance)
    return tied[0] if len(tied) == 1 else rng.choice(tied)


def pick_weighted(scores: Mapping[str, float], rng: random.Random) -> str:
    """An id drawn with probability proportional to its score (uniform when all are 0)."""
    if not scores:
        raise NoEndpointError("no candidate to pick from")
    ids = sorted(scores)
    weights = [max(0.0, scores[c]) for c in ids]
    total = sum(weights)
    if total <= 0:
        return rng.choice(ids)
    point = rng.random() * total
    for candidate, weight in zip(ids, weights, strict=True):
        point -= weight
        if point < 0:
            return candidate
    return next(c for c, w in zip(reversed(ids), reversed(weights), strict=True) if w > 0)
