"""What a scorer gets (`ScoringContext`) and returns, plus the clamping all scorers share.

Owns the contract and the min-max scaling; never weighs scores (the pipeline does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from loom_router.core.load import LoadView


@dataclass(frozen=True)
class ScoringContext:
    """One pick's inputs, shared by every scorer. `candidates` passed the filters."""

    candidates: tuple[str, ...]
    load: LoadView
    prefix_blocks: Mapping[str, int]
    """Consecutive prompt blocks each candidate holds (after the hot-spot rule)."""
    total_blocks: int
    """Full blocks in the prompt."""
    session_endpoint: str | None = None
    """Where the request's session went last (after the hot-spot rule), if anywhere."""
    host_blocks: Mapping[str, int] = field(default_factory=dict)
    """Of `prefix_blocks`, those only a host tier holds (CPU KV offload: reloaded, not hit)."""
    host_hit_weight: float = 1.0
    """What a host-tier block counts for against a device-resident one (RoutingSettings)."""


Scorer = Callable[[ScoringContext], dict[str, float]]


def clamp(value: float) -> float:
    """Into [0, 1]; NaN becomes 0 (a broken input never wins)."""
    if not value > 0.0:  # also catches NaN
        return 0.0
    return 1.0 if value > 1.0 else value


def with_fleet_mean(candidates: tuple[str, ...], values: Mapping[str, float]) -> dict[str, float]:
    """`values` with each unknown candidate (no fresh scrape) at the mean of the known ones.

    A stale endpoint is neither the best (it may be loaded) nor the worst (on a saturated
    machine a burst could otherwise skip it entirely): it counts as the fleet's average.
    Nothing known: nothing to impute, `values` as given.
    """
    known = [values[c] for c in candidates if c in values]
    if not known:
        return dict(values)
    mean = sum(known) / len(known)
    return {c: values.get(c, mean) for c in candidates}


def lower_is_better(candidates: tuple[str, ...], values: Mapping[str, float]) -> dict[str, float]:
    """Min-max scaled so the lowest value scores 1 and the highest 0 (all equal: all 1).

    An unknown candidate counts as the fleet mean (`with_fleet_mean`); with nothing known at
    all, every candidate scores 0.
    """
    values = with_fleet_mean(candidates, values)
    known = [values[c] for c in candidates if c in values]
    if not known:
        return dict.fromkeys(candidates, 0.0)
    low, high = min(known), max(known)
    span = high - low
    return {c: 1.0 if span <= 0 else clamp((high - values[c]) / span) for c in candidates}


def fewer_is_better(ctx: ScoringContext, metric: str) -> dict[str, float]:
    """`lower_is_better` over one scraped engine metric (`waiting`, `running`) of each candidate."""
    values: dict[str, float] = {}
    for c in ctx.candidates:
        m = ctx.load.fresh.get(c)
        value = None if m is None else getattr(m, metric)
        if value is not None:
            values[c] = value
    return lower_is_better(ctx.candidates, values)
