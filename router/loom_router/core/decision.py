"""The pipeline's answer: `RoutingDecision` (where to send, why, and every candidate's score).

Owns the records only; never decides anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom_router.core.endpoints import Endpoint
from loom_router.core.filters import Rejection
from loom_router.core.pd_decider import PDDecision


@dataclass(frozen=True)
class EndpointScore:
    """One candidate's weighted total and its raw scores in [0, 1], for debugging."""

    endpoint_id: str
    total: float
    parts: tuple[tuple[str, float], ...]
    cached_blocks: int
    """Consecutive prompt blocks the index says it holds (before the hot-spot rule)."""


@dataclass(frozen=True)
class RoutingDecision:
    """Send the request to `endpoint`; if `prefill` is set, prefill it there first (P/D)."""

    request_id: str
    endpoint: Endpoint
    prefill: Endpoint | None
    pd: PDDecision
    reason: str
    scores: tuple[EndpointScore, ...]
    """The chosen endpoint's scores, then the best other candidates' (settings.debug_scores)."""
    prefill_scores: tuple[EndpointScore, ...]
    """The same for prefill candidates (empty unless disaggregated)."""
    total_blocks: int
    cached_blocks: int
    spilled_from: tuple[str, ...]
    """Hot endpoints whose locality credit was ignored for this pick."""
    rejected: tuple[Rejection, ...]
    """Endpoints of the serving roles the filters dropped, and why."""
