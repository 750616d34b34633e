"""The pick and its in-flight prefixes (router.inFlightPrefixSeconds): off, replicas
fed the same KV events make the same decisions; on, a burst sharing a new prompt stays together."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from loom_router.core.endpoints import Endpoint, StaticEndpoints
from loom_router.core.kv_events import DecodedBatch
from loom_router.core.load import EngineMetrics
from loom_router.core.request import RequestFeatures, features_from_tokens
from loom_router.core.settings import RoutingSettings
from loom_router.core.state import RouterState
from loom_router.errors import CapacityWaitError, NoEndpointError, classify
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.picking import Picking
from loom_router.shell.upstream import Upstream, UpstreamTimeouts
from loom_runtime.wire.kv_events import BlockStored

EndpointFactory = Callable[..., Endpoint]
BS = 16
SETTINGS = RoutingSettings(block_size=BS, stale_after_s=3600.0, in_flight_prefix_s=0.0)
OLD = list(range(1000, 1000 + 8 * BS))  # a prompt the engines reported long ago
NEW = list(range(5000, 5000 + 4 * BS))  # a prompt no engine has reported yet


def replica(endpoint: EndpointFactory, settings: RoutingSettings) -> Picking:
    """One router replica over endpoints a, b, c (nothing is started: picks only)."""
    source = StaticEndpoints([endpoint(i, role="aggregated") for i in ("a", "b", "c")])
    state = RouterState(settings)
    state.on_endpoints(source.snapshot())
    upstream = Upstream(UpstreamTimeouts())
    metrics = RouterMetrics()
    return Picking(source=source, state=state, upstream=upstream, metrics=metrics)


def request(picking: Picking, request_id: str, tokens: Sequence[int]) -> RequestFeatures:
    return features_from_tokens(request_id, tokens, picking.state.hasher)


def cached(picking: Picking, endpoint_id: str, tokens: Sequence[int]) -> None:
    """The KV event an engine sends after prefilling `tokens`."""
    hashes = picking.state.hasher.hash_blocks(tokens)
    event = BlockStored(tuple(hashes), None, tuple(tokens[: len(hashes) * BS]), BS)
    picking.state.prefix.apply_batch(endpoint_id, DecodedBatch(0.0, (event,), 0))


def scrape(replicas: Sequence[Picking], waiting: dict[str, int]) -> None:
    """Every replica reads the same scrape: the more waiting, the fuller the KV cache."""
    now = time.monotonic()
    for picking in replicas:
        for endpoint_id, n in waiting.items():
            metrics = EngineMetrics(waiting=n, running=0, kv_usage=0.1 + 0.05 * n)
            picking.state.load.record_scrape(endpoint_id, metrics, now)


def test_in_flight_prefixes_are_kept_only_when_on_and_precise(
    endpoint: EndpointFactory,
) -> None:
    assert replica(endpoint, RoutingSettings(in_flight_prefix_s=0)).state.in_flight is None
    approximate = RoutingSettings(prefix_scorer="approximate", in_flight_prefix_s=10.0)
    assert replica(endpoint, approximate).state.in_flight is None
    on = replica(endpoint, RoutingSettings(in_flight_prefix_s=2.5)).state.in_flight
    assert on is not None and on.ttl_s == 2.5


@pytest.mark.parametrize(
    ("seconds", "follow_up"),
    [(0.0, ["c", "c"]), (10.0, ["a", "c"])],  # on: replica 0 alone remembers where NEW went
)
def test_replicas_that_routed_different_requests_agree_unless_in_flight_prefixes_are_on(
    endpoint: EndpointFactory, seconds: float, follow_up: list[str]
) -> None:
    replicas = [replica(endpoint, replace(SETTINGS, in_flight_prefix_s=seconds)) for _ in "01"]
    for picking in replicas:  # the same KV events reach both
        cached(picking, "b", OLD)
    scrape(replicas, {"a": 0, "b": 2, "c": 2})
    assert replicas[0].pick(request(replicas[0], "r0", NEW)).endpoint.id == "a"
    replicas[1].pick(request(replicas[1], "r1", [*OLD, 1, 2]))
    scrape(replicas, {"a": 2, "b": 2, "c": 0})  # NEW's KV events have not arrived yet
    picks = [d.pick(request(d, "r2", [*NEW, 7])).endpoint.id for d in replicas]
    assert picks == follow_up


def test_a_burst_sharing_a_new_prompt_stays_where_the_first_went_with_in_flight_prefixes(
    endpoint: EndpointFactory,
) -> None:
    sent = {}
    for seconds in (0.0, 10.0):
        picking = replica(endpoint, replace(SETTINGS, in_flight_prefix_s=seconds))
        burst = [request(picking, f"burst-{n}", [*NEW, n]) for n in range(12)]
        sent[seconds] = [picking.pick(features).endpoint.id for features in burst]
    assert sent[10.0] == [sent[10.0][0]] * 12
    assert len(set(sent[0.0])) > 1  # off: the idle fleet ties, so the burst is spread


def test_replicas_break_ties_the_same_way_whatever_they_routed_before(
    endpoint: EndpointFactory,
) -> None:
    replicas = [replica(endpoint, SETTINGS) for _ in "01"]
    for n in range(5):  # different histories: replica 0 saw five requests, replica 1 none
        replicas[0].pick(request(replicas[0], f"earlier-{n}", [9000 + n] * BS))
    for n in range(20):  # an idle fleet and a new prompt: every endpoint ties
        picks = {d.pick(request(d, f"tie-{n}", [*NEW, n])).endpoint.id for d in replicas}
        assert len(picks) == 1


def test_requests_held_for_paused_capacity_are_counted_and_exported(
    endpoint: EndpointFactory,
) -> None:
    """While every serving worker is draining (a one-replica sync) a request waits, counted in
    loom_router:held_requests, and is routed when one serves again."""
    source = StaticEndpoints([endpoint("a", role="aggregated", draining=True)])
    state = RouterState(SETTINGS)
    state.on_endpoints(source.snapshot())
    metrics = RouterMetrics()
    picking = Picking(source=source, state=state, upstream=Upstream(UpstreamTimeouts()),
                      metrics=metrics)  # fmt: skip

    async def scenario() -> tuple[int, str, str]:
        waiting = asyncio.create_task(picking.pick_waiting(request(picking, "r1", NEW)))
        while picking.held == 0:
            await asyncio.sleep(0.01)
        exported = metrics.render().decode()
        source.update(replace(source.snapshot().endpoints[0], draining=False))
        choice = await waiting
        return picking.held, exported, choice.endpoint.id

    held_after, exported, picked = asyncio.run(scenario())
    assert "loom_router:held_requests 1.0" in exported
    assert held_after == 0 and picked == "a"


def holding(
    endpoints: Sequence[Endpoint], settings: RoutingSettings
) -> tuple[StaticEndpoints, Picking]:
    source = StaticEndpoints(list(endpoints))
    state = RouterState(settings)
    state.on_endpoints(source.snapshot())
    upstream = Upstream(UpstreamTimeouts())
    return source, Picking(source=source, state=state, upstream=upstream, metrics=RouterMetrics())


def test_the_hold_is_bounded_in_count_and_time_then_503_with_retry_after(
    endpoint: EndpointFactory,
) -> None:
    settings = replace(SETTINGS, max_held=1, hold_s=0.3)
    _, picking = holding([endpoint("a", role="aggregated", draining=True)], settings)

    async def scenario() -> tuple[BaseException, BaseException]:
        first = asyncio.create_task(picking.pick_waiting(request(picking, "r1", NEW)))
        while picking.held == 0:
            await asyncio.sleep(0.01)
        with pytest.raises(CapacityWaitError) as full:  # the hold is full: refused at once
            await picking.pick_waiting(request(picking, "r2", NEW))
        with pytest.raises(CapacityWaitError) as expired:  # held its time, then refused
            await first
        return full.value, expired.value

    full, expired = asyncio.run(scenario())
    assert picking.held == 0
    assert "router.hold.maxRequests 1" in str(full)
    assert "router.hold.timeoutSeconds" in str(expired) and "r1" in str(expired)
    reply = classify(full)
    assert (reply.status, reply.code, reply.headers) == (503, "no_endpoint", {"Retry-After": "5"})


@pytest.mark.parametrize("from_zero", [True, False])
def test_with_no_worker_at_all_a_request_is_held_only_when_the_fleet_scales_from_zero(
    endpoint: EndpointFactory, from_zero: bool
) -> None:
    source, picking = holding([], replace(SETTINGS, hold_when_empty=from_zero))

    async def scenario() -> str:
        waiting = asyncio.create_task(picking.pick_waiting(request(picking, "r1", NEW)))
        await asyncio.sleep(0.2)  # the planner sees it held and starts a worker
        source.add(endpoint("a", role="aggregated"))
        picking.state.on_endpoints(source.snapshot())
        return (await waiting).endpoint.id

    if from_zero:
        assert asyncio.run(scenario()) == "a"
    else:
        with pytest.raises(NoEndpointError) as refused:
            asyncio.run(scenario())
        assert not isinstance(refused.value, CapacityWaitError)


def test_max_model_len_is_learned_per_endpoint(endpoint: EndpointFactory) -> None:
    asyncio.run(_lengths_per_endpoint(endpoint))


async def _lengths_per_endpoint(endpoint: EndpointFactory) -> None:
    """Two workers (stub HTTP servers, a test double of /v1/models) with different lengths."""
    from aiohttp import web

    async def serve(length: int) -> tuple[web.AppRunner, str]:
        async def models(_: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "tiny", "max_model_len": length}]})

        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return runner, f"http://127.0.0.1:{port}"

    short, short_url = await serve(512)
    long, long_url = await serve(8192)
    picking = replica(endpoint, SETTINGS)
    await picking.upstream.start()
    try:
        a = replace(endpoint("a", role="aggregated"), url=short_url)
        b = replace(endpoint("b", role="aggregated"), url=long_url)
        assert await picking.max_model_len(a) == 512
        assert await picking.max_model_len(b) == 8192
        assert await picking.max_model_len(a) == 512
        gone = replace(a, url="http://127.0.0.1:9")  # nothing listens: unknown, not a guess
        assert await picking.max_model_len(gone) is None
    finally:
        await picking.upstream.close()
        await short.cleanup()
        await long.cleanup()


def test_a_fleet_scaling_from_zero_holds_while_its_starting_worker_reads_as_down(
    endpoint: EndpointFactory,
) -> None:
    """Its first worker does not answer until it serves: marked down meanwhile, it is not a
    reason to refuse (a fleet that does not scale from zero refuses at once, as before)."""
    for from_zero in (True, False):
        settings = replace(SETTINGS, hold_when_empty=from_zero, hold_s=30.0)
        source, picking = holding([endpoint("a", role="aggregated", down=True)], settings)

        async def scenario(source: StaticEndpoints, picking: Picking) -> str:
            waiting = asyncio.create_task(picking.pick_waiting(request(picking, "r1", NEW)))
            await asyncio.sleep(0.2)
            picking.state.on_endpoints(source.mark_up("a"))
            return (await waiting).endpoint.id

        if from_zero:
            assert asyncio.run(scenario(source, picking)) == "a"
        else:
            with pytest.raises(NoEndpointError):
                asyncio.run(scenario(source, picking))


def test_a_fleet_scaling_from_zero_with_a_worker_serving_refuses_what_none_can_take(
    endpoint: EndpointFactory,
) -> None:
    """A request pinned to a weights version no worker serves is refused at once, not held:
    holding is for a fleet with no serving worker."""
    settings = replace(SETTINGS, hold_when_empty=True, hold_s=30.0)
    _, picking = holding([endpoint("a", role="aggregated", version="v1")], settings)
    pinned = replace(request(picking, "r1", NEW), weights_version="v9")
    with pytest.raises(NoEndpointError) as refused:
        asyncio.run(picking.pick_waiting(pinned))
    assert not isinstance(refused.value, CapacityWaitError)  # refused, not held to the deadline
