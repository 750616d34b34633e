from __future__ import annotations

from collections.abc import Callable

from loom_router.core.approx_index import text_keys
from loom_router.core.decision import RoutingDecision
from loom_router.core.endpoints import Endpoint, StaticEndpoints
from loom_router.core.inflight_prefixes import WithInFlight
from loom_router.core.kv_events import DecodedBatch
from loom_router.core.load import EngineMetrics
from loom_router.core.pd_decider import PDDecision
from loom_router.core.request import RequestFeatures
from loom_router.core.settings import RoutingSettings
from loom_router.core.state import RouterState
from loom_runtime.wire.kv_events import BlockStored

EndpointFactory = Callable[..., Endpoint]


def decision_for(endpoint: Endpoint, prefill: Endpoint | None = None) -> RoutingDecision:
    pd = PDDecision(prefill is not None, "test", 10, 0)
    return RoutingDecision("r", endpoint, prefill, pd, "test", (), (), 0, 0, (), ())


def test_endpoints_leaving_are_dropped_from_every_index(endpoint: EndpointFactory) -> None:
    state = RouterState(RoutingSettings())
    source = StaticEndpoints([endpoint("a"), endpoint("b")])
    source.subscribe(state.on_endpoints)
    state.on_endpoints(source.snapshot())
    tokens = tuple(range(16))
    event = BlockStored(tuple(state.hasher.hash_blocks(tokens)), None, tokens, 16)
    for i in ("a", "b"):
        state.prefix.apply_batch(i, DecodedBatch(0.0, (event,), 0))
        state.approx.record(i, (1, 2, 3))
        state.sessions.record(f"s-{i}", i)
        state.load.begin(i)
        state.load.record_scrape(i, EngineMetrics(waiting=1), at=0.0)
    source.remove("a")
    assert state.prefix.blocks_of("a") == 0 and state.prefix.blocks_of("b") == 1
    assert state.approx.match(["a", "b"], (1, 2, 3)) == {"a": 0, "b": 3}
    assert state.sessions.lookup("s-a") is None and state.sessions.lookup("s-b") == "b"
    view = state.load.view(0.0)
    assert view.in_flight_of("a") == 0 and view.metrics("a") is None
    assert view.in_flight_of("b") == 1 and view.metrics("b") is not None


def test_a_new_weights_version_forgets_the_approximate_cache(endpoint: EndpointFactory) -> None:
    state = RouterState(RoutingSettings(prefix_scorer="approximate"))
    source = StaticEndpoints([endpoint("a", version="v1")])
    source.subscribe(state.on_endpoints)
    state.on_endpoints(source.snapshot())
    state.approx.record("a", (1, 2))
    source.drain("a")  # same version: kept
    assert state.approx.match(["a"], (1, 2)) == {"a": 2}
    source.update(endpoint("a", version="v2"))
    assert state.approx.match(["a"], (1, 2)) == {"a": 0}


def test_remember_records_session_and_approximate_blocks(endpoint: EndpointFactory) -> None:
    state = RouterState(RoutingSettings())
    keys = text_keys("z" * 640)
    req = RequestFeatures("r", 160, text_keys=keys, session_token="conv")
    state.remember(decision_for(endpoint("d1"), endpoint("p1", role="prefill")), req)
    assert state.sessions.lookup("conv") == "d1"
    assert state.approx.match(["d1", "p1"], keys) == {"d1": 10, "p1": 10}


def test_lookup_follows_the_configured_scorer() -> None:
    precise = RouterState(RoutingSettings(prefix_scorer="precise", in_flight_prefix_s=0))
    approx = RouterState(RoutingSettings(prefix_scorer="approximate"))
    assert precise.lookup(0.0) is precise.prefix
    assert approx.lookup(0.0) is approx.approx
    with_in_flight = RouterState(RoutingSettings(prefix_scorer="precise", in_flight_prefix_s=5))
    assert isinstance(with_in_flight.lookup(0.0), WithInFlight)


def test_in_flight_prefixes_are_forgotten_when_an_endpoint_leaves_or_changes_weights(
    endpoint: EndpointFactory,
) -> None:
    state = RouterState(RoutingSettings(in_flight_prefix_s=60))
    assert state.in_flight is not None
    source = StaticEndpoints([endpoint("a"), endpoint("b")])
    state.on_endpoints(source.snapshot())
    state.in_flight.record("a", [1, 2], now=0.0)
    state.in_flight.record("b", [1, 2], now=0.0)
    state.on_endpoints(StaticEndpoints([endpoint("a", version="v2")]).snapshot())  # b left
    assert state.in_flight.match(["a", "b"], [1, 2], now=1.0) == {"a": 0, "b": 0}
