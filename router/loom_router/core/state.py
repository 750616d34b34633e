"""The mutable state one router replica keeps (indexes, sessions, load) and its upkeep.

Owns creating that state from RoutingSettings, pruning it when endpoints leave or change
weights, and recording where requests went; never picks (the EndpointPicker does) and no I/O.
"""

from __future__ import annotations

from loom_router.core.approx_index import ApproxIndex
from loom_router.core.decision import RoutingDecision
from loom_router.core.endpoints import EndpointSnapshot
from loom_router.core.inflight_prefixes import InFlightPrefixes, WithInFlight
from loom_router.core.load import LoadTracker
from loom_router.core.pipeline import PrefixLookup, RoutingInputs
from loom_router.core.prefix_index import PrefixIndex
from loom_router.core.request import RequestFeatures
from loom_router.core.scorers.session import SessionTable
from loom_router.core.settings import RoutingSettings
from loom_runtime.wire.prefix_hash import PrefixHasher


class RouterState:
    """Everything a pick reads besides the request. Every part is bounded by its setting.

    Call `on_endpoints` from the endpoint source's listener, `remember` after each pick, and
    `inputs(snapshot, now)` to get a pick's inputs. Thread-safe as its parts are.
    """

    def __init__(self, settings: RoutingSettings) -> None:
        self.settings = settings
        self.hasher = PrefixHasher(settings.block_size, settings.hash_seed, settings.hash_algo)
        self.prefix = PrefixIndex(settings.max_index_entries, self.hasher)
        self.approx = ApproxIndex(settings.approx_blocks_per_endpoint)
        self.sessions = SessionTable(settings.max_sessions)
        self.load = LoadTracker(settings.stale_after_s)
        self.in_flight = (
            InFlightPrefixes(settings.in_flight_prefix_s)
            if settings.prefix_scorer == "precise" and settings.in_flight_prefix_s > 0
            else None
        )
        """Prefixes just routed, before their KV events (router.inFlightPrefixSeconds); None
        when off, so that replicas fed the same KV events decide the same."""
        self._versions: dict[str, str] = {}

    def lookup(self, now: float) -> PrefixLookup:
        """The index the configured prefix scorer reads (precise: plus prefixes in flight)."""
        if self.settings.prefix_scorer != "precise":
            return self.approx
        if self.in_flight is None:
            return self.prefix
        return WithInFlight(self.prefix, self.in_flight, now)

    def inputs(self, snapshot: EndpointSnapshot, now: float) -> RoutingInputs:
        return RoutingInputs(snapshot, self.load.view(now), self.lookup(now), self.sessions)

    def on_endpoints(self, snapshot: EndpointSnapshot) -> tuple[str, ...]:
        """Drop what is known about endpoints that left; forget the approximate cache of
        endpoints whose weights version changed (their engines cleared it), and what was in
        flight to either. Returns the ids that left."""
        current = {e.id: e.weights_version for e in snapshot.endpoints}
        gone = tuple(sorted(set(self._versions) - set(current)))
        for endpoint_id in gone:
            self._forget_in_flight(endpoint_id)
            self.prefix.remove_endpoint(endpoint_id)
            self.approx.remove_endpoint(endpoint_id)
            self.sessions.forget_endpoint(endpoint_id)
        self.load.forget(gone)
        for endpoint_id, version in current.items():
            old = self._versions.get(endpoint_id)
            if old is not None and old != version:
                self.approx.clear_endpoint(endpoint_id)
                self._forget_in_flight(endpoint_id)
        self._versions = current
        return gone

    def remember(
        self, decision: RoutingDecision, request: RequestFeatures, now: float = 0.0
    ) -> None:
        """Where the request went: the session's endpoint, and what it will cache (approximate:
        the text's blocks; precise with in-flight prefixes: the prompt's blocks until `now` +
        the window)."""
        if self.in_flight is not None and request.block_keys:
            self.in_flight.record(decision.endpoint.id, request.block_keys, now)
            if decision.prefill is not None:
                self.in_flight.record(decision.prefill.id, request.block_keys, now)
        if self.settings.session_affinity:
            self.sessions.record(request.session_token, decision.endpoint.id)
        if request.text_keys:
            self.approx.record(decision.endpoint.id, request.text_keys)
            if decision.prefill is not None:
                self.approx.record(decision.prefill.id, request.text_keys)

    def _forget_in_flight(self, endpoint_id: str) -> None:
        if self.in_flight is not None:
            self.in_flight.forget(endpoint_id)
