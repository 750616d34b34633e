"""The anti-hot-spot rule: an endpoint far busier than the fleet loses its locality credit.

Owns the rule only (pure). Without it, every request sharing a system prompt would follow the
prefix score to the one endpoint that cached it first (the reference routers' hot spot).

Rule: with load(e) = max(router in-flight on e, fresh running + waiting on e) and
mean = the mean load over the candidates, e is hot iff load(e) > mean × (1 + margin) + 1.
A hot endpoint's prefix match and session affinity count as nothing for this pick, so the
request goes to the best of the others by load; it comes back once the others catch up.
Among endpoints holding the same prefix, the load scorers already balance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class HotSpots:
    hot: frozenset[str]
    mean_load: float
    threshold: float
    """Loads above this are hot."""


def hot_spots(loads: Mapping[str, float], spill_margin: float) -> HotSpots:
    """Which of the candidates (keys of `loads`) are hot."""
    if not loads:
        return HotSpots(frozenset(), 0.0, 0.0)
    mean = sum(loads.values()) / len(loads)
    threshold = mean * (1.0 + spill_margin) + 1.0
    return HotSpots(frozenset(e for e, v in loads.items() if v > threshold), mean, threshold)


def strip_locality(
    prefix_blocks: Mapping[str, int], session_endpoint: str | None, spots: HotSpots
) -> tuple[dict[str, int], str | None, tuple[str, ...]]:
    """Prefix matches and session endpoint with hot endpoints' credit removed.

    Returns also the hot endpoints that lost credit (the ones a request spilled from).
    """
    spilled = sorted(e for e in spots.hot if prefix_blocks.get(e, 0) > 0 or e == session_endpoint)
    blocks = {e: (0 if e in spots.hot else n) for e, n in prefix_blocks.items()}
    session = None if session_endpoint in spots.hot else session_endpoint
    return blocks, session, tuple(spilled)
