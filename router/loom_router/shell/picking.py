"""Where a request goes: the scored EndpointPicker (or a random / round-robin baseline for
benchmarks) over the live endpoint table, first picks, waits for paused capacity, and re-picks
for a migration.

Owns the pick policy, its metric label and what it remembers of a pick (in-flight prefixes,
sessions); never sends anything to a worker (the attempt loop does) and never reads a body.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, replace

from loom_router.core.endpoints import Endpoint, StaticEndpoints
from loom_router.core.filters import SERVING_ROLES, filter_endpoints, rejection
from loom_router.core.pipeline import EndpointPicker
from loom_router.core.request import RequestFeatures
from loom_router.core.state import RouterState
from loom_router.errors import CapacityWaitError, NoEndpointError
from loom_router.shell.config import POLICIES, Policy
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.upstream import Upstream
from loom_runtime.wire.metric_names import ROUTER_HELD_REQUESTS

CAPACITY_POLL_S = 0.05
RETRY_AFTER_S = 5
"""What a 503 from a full or expired hold tells the client to wait before it tries again."""


@dataclass(frozen=True)
class Choice:
    """Where a request goes, and the bounded label saying why (for metrics)."""

    endpoint: Endpoint
    prefill: Endpoint | None
    why: str
    reason: str = ""


MAX_KNOWN_LENGTHS = 4096


class Picking:
    """The pick policy of one router replica over its endpoint table and routing state."""

    def __init__(
        self,
        *,
        source: StaticEndpoints,
        state: RouterState,
        upstream: Upstream,
        metrics: RouterMetrics,
        policy: Policy = "scored",
        seed: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.source = source
        self.state = state
        self.picker = EndpointPicker(state.settings)
        self.upstream = upstream
        self.metrics = metrics
        self.policy = policy
        self.rng = random.Random(seed)
        self._turn = 0
        self._max_model_len: dict[str, int] = {}
        """Endpoint URL -> its served context length, learned once per address."""
        self.held = 0
        """Requests held in `pick_waiting` now (a sync, a gap, a start from zero)."""
        metrics.add_gauge(
            ROUTER_HELD_REQUESTS,
            "Requests held (not refused) while every worker that could take them is paused: "
            "a weight sync or a capacity gap. `loom up` reports it in the Ready condition.",
            (),
            lambda: [((), float(self.held))],
        )

    def pick(self, features: RequestFeatures) -> Choice:
        choice = self._choose(features)
        self.metrics.inc("routed", choice.endpoint.id, choice.why)
        return choice

    async def pick_waiting(self, features: RequestFeatures) -> Choice:
        """`pick`, but while no worker can take the request only for now — every one that could
        is paused (a Barrier sync, a capacity gap), or none exists and the fleet scales from
        zero — hold it, bounded by the card's router.hold: at most `max_held` at once, each for
        at most `hold_s`; then 503 with Retry-After."""
        try:
            return self.pick(features)
        except NoEndpointError:
            if not self._may_hold():
                raise
        settings = self.state.settings
        if self.held >= settings.max_held:
            raise CapacityWaitError(
                f"request {features.request_id}: no worker can take it now and "
                f"{self.held} request(s) already wait (router.hold.maxRequests "
                f"{settings.max_held}); retry after {RETRY_AFTER_S}s",
                RETRY_AFTER_S,
            )
        deadline = time.monotonic() + settings.hold_s
        self.held += 1
        try:
            while True:
                await asyncio.sleep(CAPACITY_POLL_S)
                try:
                    return self.pick(features)
                except NoEndpointError as exc:
                    if not self._may_hold():
                        raise
                    if time.monotonic() >= deadline:
                        raise CapacityWaitError(
                            f"request {features.request_id}: held {settings.hold_s:g}s "
                            f"(router.hold.timeoutSeconds) and no worker could take it: {exc}",
                            RETRY_AFTER_S,
                        ) from exc
        finally:
            self.held -= 1

    def repick(self, features: RequestFeatures, exclude: set[str], version: str | None) -> Endpoint:
        """Another serving endpoint for a request that failed (on `version` if given)."""
        moved = replace(features, exclude=frozenset(exclude), weights_version=version)
        choice = self._choose(moved, remember=False)
        self.metrics.inc("routed", choice.endpoint.id, "migration")
        return choice.endpoint

    def pin(self, features: RequestFeatures, endpoint_id: str) -> Endpoint:
        """That endpoint, if it passes the filters (it serves); NoEndpointError otherwise."""
        others = {e.id for e in self.source.snapshot().endpoints if e.id != endpoint_id}
        choice = self._choose(replace(features, exclude=frozenset(others)), remember=False)
        self.metrics.inc("routed", choice.endpoint.id, "pinned")
        return choice.endpoint

    async def max_model_len(self, endpoint: Endpoint) -> int | None:
        """The endpoint's served context length, learned once per endpoint address from its
        /v1/models (workers may differ: a card's roles set their own maxModelLen)."""
        known = self._max_model_len.get(endpoint.url)
        if known is not None:
            return known
        try:
            status, text = await self.upstream.get(endpoint.url + "/v1/models", 5.0)
            data = json.loads(text)["data"][0]["max_model_len"] if status == 200 else None
        except Exception:  # any failure: unknown for now (asked again next time)
            data = None
        if not isinstance(data, int):
            return None
        if len(self._max_model_len) >= MAX_KNOWN_LENGTHS:  # bounded: addresses come and go
            self._max_model_len.clear()
        self._max_model_len[endpoint.url] = data
        return data

    @property
    def scales_from_zero(self) -> bool:
        """While no worker can take a request, it waits for one (ROUTER.json scale_from_zero):
        the planner starts workers for what the router holds."""
        return self.state.settings.hold_when_empty

    def _may_hold(self) -> bool:
        """Capacity is only paused: some serving worker is held back for now (draining, not
        ready, admission closed, mid weight sync), not marked down — or the fleet scales from
        zero and no worker serves, where one is starting or will be (one that does not answer
        yet reads as down until it serves). With a worker serving, a request none can take is
        refused at once, as on any fleet."""
        serving = [e for e in self.source.snapshot().endpoints if e.role in SERVING_ROLES]
        if self.scales_from_zero and not any(e.routable for e in serving):
            return True
        load = self.state.load.view(time.monotonic())
        return any(not e.down and rejection(e, load) is not None for e in serving)

    def _choose(self, features: RequestFeatures, remember: bool = True) -> Choice:
        snapshot = self.source.snapshot()
        if self.policy != "scored":
            load = self.state.load.view(time.monotonic())
            kept = filter_endpoints(
                snapshot.endpoints, SERVING_ROLES, load, features.weights_version,
                features.exclude,
            ).kept  # fmt: skip
            if not kept:
                raise NoEndpointError(f"request {features.request_id}: no endpoint can take it")
            if self.policy == "random":
                return Choice(self.rng.choice(kept), None, "random")
            self._turn += 1
            return Choice(kept[self._turn % len(kept)], None, "round-robin")
        now = time.monotonic()
        inputs = self.state.inputs(snapshot, now)
        # Ties break by the request's own id: replicas that saw the same events pick the same.
        decision = self.picker.pick(features, inputs, random.Random(features.request_id))
        if remember:
            self.state.remember(decision, features, now)
        if decision.spilled_from:
            why = "spill"
        elif decision.cached_blocks > 0:
            why = "prefix"
        elif dict(decision.scores[0].parts).get("session_affinity", 0.0) > 0:
            why = "session"
        else:
            why = "load"
        return Choice(decision.endpoint, decision.prefill, why, decision.reason)
