"""The endpoint picker: filters → hot-spot rule → scorers → picker → P/D decider.

Owns composing them into one `RoutingDecision`; pure given the request, the inputs and the
random generator (it reads the indexes, never changes them, and does no I/O).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from loom_router.core.approx_index import TOKENS_PER_BLOCK
from loom_router.core.decision import EndpointScore, RoutingDecision
from loom_router.core.endpoints import Endpoint, EndpointSnapshot
from loom_router.core.filters import PREFILL_ROLES, SERVING_ROLES, Rejection, filter_endpoints
from loom_router.core.hotspot import hot_spots, strip_locality
from loom_router.core.load import LoadView
from loom_router.core.pd_decider import cached_tokens, decide
from loom_router.core.picker import pick_max, pick_weighted
from loom_router.core.request import RequestFeatures
from loom_router.core.scorers import (
    in_flight,
    kv_cache_utilization,
    prefix,
    queue,
    running,
    session,
)
from loom_router.core.scorers.contract import Scorer, ScoringContext, clamp
from loom_router.core.settings import RoutingSettings
from loom_router.errors import NoEndpointError

SCORERS: Mapping[str, Scorer] = {
    "prefix_cache": prefix.score,
    "queue": queue.score,
    "kv_cache_utilization": kv_cache_utilization.score,
    "running": running.score,
    "in_flight": in_flight.score,
    "session_affinity": session.score,
}
"""Every scorer by name; ScorerWeights has a weight of the same name for each."""


class PrefixLookup(Protocol):
    """A prefix index (precise or approximate), read-only."""

    def match(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]: ...

    def host_blocks(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        """Of each match, the blocks only a host tier holds (reloaded, not device hits)."""
        ...


class SessionLookup(Protocol):
    def lookup(self, token: str | None) -> str | None: ...


@dataclass(frozen=True)
class RoutingInputs:
    """The state one pick reads: endpoints, load, a prefix index and the session table."""

    endpoints: EndpointSnapshot
    load: LoadView
    prefix: PrefixLookup
    sessions: SessionLookup | None = None


@dataclass(frozen=True)
class _Ranking:
    """Every candidate's scores, column per scorer (kept as plain lists: this is the hot path)."""

    ids: tuple[str, ...]
    names: tuple[str, ...]
    columns: tuple[list[float], ...]
    totals: dict[str, float]
    matched: Mapping[str, int]
    spilled: tuple[str, ...]

    def score(self, position: int) -> EndpointScore:
        endpoint_id = self.ids[position]
        parts = tuple((n, col[position]) for n, col in zip(self.names, self.columns, strict=True))
        return EndpointScore(
            endpoint_id, self.totals[endpoint_id], parts, self.matched.get(endpoint_id, 0)
        )

    def explain(self, chosen: str, top: int) -> tuple[EndpointScore, ...]:
        """The chosen candidate first, then the best others, `top` in all."""
        order = heapq.nsmallest(
            top, range(len(self.ids)), key=lambda p: (-self.totals[self.ids[p]], self.ids[p])
        )
        first = self.ids.index(chosen)
        return tuple(self.score(p) for p in [first, *(p for p in order if p != first)][:top])


class EndpointPicker:
    """Picks endpoints for requests under one RoutingSettings. Holds no per-request state, so
    two replicas with the same inputs and seed make the same decisions."""

    def __init__(self, settings: RoutingSettings) -> None:
        self.settings = settings
        active = [
            (name, weight)
            for name, weight in settings.weights.as_pairs()
            if weight > 0 and (name != "session_affinity" or settings.session_affinity)
        ]
        self._names = tuple(name for name, _ in active)
        self._weights = tuple(weight for _, weight in active)
        self._fns = tuple(SCORERS[name] for name in self._names)
        precise = settings.prefix_scorer == "precise"
        self._tokens_per_key = settings.block_size if precise else TOKENS_PER_BLOCK

    def pick(
        self, request: RequestFeatures, inputs: RoutingInputs, rng: random.Random
    ) -> RoutingDecision:
        """Where `request` goes. NoEndpointError (saying why each endpoint was dropped) if
        no endpoint of a serving role may take it."""
        main = filter_endpoints(
            inputs.endpoints.endpoints,
            SERVING_ROLES,
            inputs.load,
            request.weights_version,
            request.exclude,
        )
        if not main.kept:
            raise NoEndpointError(_no_endpoint_message(request, main.rejected))
        keys = self.keys(request)
        token = request.session_token if self.settings.session_affinity else None
        sticky = inputs.sessions.lookup(token) if inputs.sessions is not None else None
        ranking = self._rank(main.kept, inputs, keys, sticky)
        chosen = inputs.endpoints.by_id[self._choose(ranking.totals, rng)]
        scores = ranking.explain(chosen.id, self.settings.debug_scores)
        best = scores[0]
        cached = cached_tokens(best.cached_blocks, self._tokens_per_key, request.prompt_tokens)
        prefills = filter_endpoints(
            inputs.endpoints.endpoints,
            PREFILL_ROLES,
            inputs.load,
            chosen.weights_version,
            request.exclude,
        ).kept
        pd = decide(
            chosen,
            request.prompt_tokens,
            cached,
            self.settings.min_uncached_tokens,
            bool(prefills),
        )
        prefill: Endpoint | None = None
        prefill_scores: tuple[EndpointScore, ...] = ()
        if pd.disaggregate:
            prefill_ranking = self._rank(prefills, inputs, keys, None)
            prefill = inputs.endpoints.by_id[self._choose(prefill_ranking.totals, rng)]
            prefill_scores = prefill_ranking.explain(prefill.id, self.settings.debug_scores)
        return RoutingDecision(
            request_id=request.request_id,
            endpoint=chosen,
            prefill=prefill,
            pd=pd,
            reason=_reason(best, len(keys), ranking.spilled, pd.reason, prefill),
            scores=scores,
            prefill_scores=prefill_scores,
            total_blocks=len(keys),
            cached_blocks=best.cached_blocks,
            spilled_from=ranking.spilled,
            rejected=main.rejected,
        )

    def keys(self, request: RequestFeatures) -> tuple[int, ...]:
        """The request's keys for the configured prefix index."""
        if self.settings.prefix_scorer == "precise":
            return request.block_keys
        return request.text_keys

    def _rank(
        self,
        candidates: Sequence[Endpoint],
        inputs: RoutingInputs,
        keys: Sequence[int],
        sticky: str | None,
    ) -> _Ranking:
        ids = tuple(e.id for e in candidates)
        matched = inputs.prefix.match(ids, keys) if keys else dict.fromkeys(ids, 0)
        host = inputs.prefix.host_blocks(ids, keys) if keys else {}
        spots = hot_spots({i: inputs.load.load(i) for i in ids}, self.settings.spill_margin)
        blocks, sticky_now, spilled = strip_locality(
            matched, sticky if sticky in ids else None, spots
        )
        ctx = ScoringContext(
            ids, inputs.load, blocks, len(keys), sticky_now, host, self.settings.host_hit_weight
        )
        columns = tuple(_clamped(ids, f(ctx)) for f in self._fns)
        totals = [0.0] * len(ids)
        for weight, column in zip(self._weights, columns, strict=True):
            totals = [t + weight * v for t, v in zip(totals, column, strict=True)]
        return _Ranking(
            ids, self._names, columns, dict(zip(ids, totals, strict=True)), matched, spilled
        )

    def _choose(self, totals: Mapping[str, float], rng: random.Random) -> str:
        if self.settings.picker == "weighted":
            return pick_weighted(totals, rng)
        return pick_max(totals, rng)


def _clamped(ids: tuple[str, ...], values: Mapping[str, float]) -> list[float]:
    """Each candidate's score, forced into [0, 1] (a scorer's bug never wins a pick)."""
    get = values.get
    column = [get(i, 0.0) for i in ids]
    return column if all(0.0 <= v <= 1.0 for v in column) else [clamp(v) for v in column]


def _reason(
    best: EndpointScore,
    total_blocks: int,
    spilled: tuple[str, ...],
    pd_reason: str,
    prefill: Endpoint | None,
) -> str:
    parts = ", ".join(f"{name} {value:.2f}" for name, value in best.parts)
    text = (
        f"{best.endpoint_id}: score {best.total:.3f} ({parts}); "
        f"{best.cached_blocks}/{total_blocks} prompt blocks cached"
    )
    if spilled:
        text += f"; spilled from hot {', '.join(spilled)}"
    text += f"; {pd_reason}"
    if prefill is not None:
        text += f" ({prefill.id})"
    return text


def _no_endpoint_message(request: RequestFeatures, rejected: tuple[Rejection, ...]) -> str:
    if not rejected:
        return (
            f"request {request.request_id}: no decode or aggregated endpoint is known; "
            "check the deployment's roles and the router's endpoint discovery"
        )
    why = "; ".join(f"{r.endpoint_id}: {r.reason}" for r in rejected[:20])
    more = f" (and {len(rejected) - 20} more)" if len(rejected) > 20 else ""
    return f"request {request.request_id}: no endpoint can take it now: {why}{more}"
