from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from loom_router.core.endpoints import Endpoint, EndpointSnapshot
from loom_router.core.kv_events import DecodedBatch
from loom_router.core.load import EngineMetrics, load_view
from loom_router.core.pipeline import EndpointPicker, RoutingInputs
from loom_router.core.prefix_index import PrefixIndex
from loom_router.core.request import RequestFeatures, features_from_text, features_from_tokens
from loom_router.core.settings import RoutingSettings
from loom_router.core.state import RouterState
from loom_router.errors import ConfigError, NoEndpointError
from loom_runtime.wire.kv_events import BlockRemoved, BlockStored
from loom_runtime.wire.prefix_hash import PrefixHasher

EndpointFactory = Callable[..., Endpoint]
BS = 16
HASHER = PrefixHasher(BS, seed="0")


def cache(index: PrefixIndex, endpoint_id: str, tokens: Sequence[int]) -> None:
    """What the engine reports after prefilling `tokens`: all its full blocks are stored."""
    hashes = HASHER.hash_blocks(tokens)
    event = BlockStored(
        block_hashes=tuple(hashes),
        parent_block_hash=None,
        token_ids=tuple(tokens[: len(hashes) * BS]),
        block_size=BS,
    )
    index.apply_batch(endpoint_id, DecodedBatch(0.0, (event,), 0))


def request(request_id: str, tokens: Sequence[int], **kw: object) -> RequestFeatures:
    return features_from_tokens(request_id, tokens, HASHER, **kw)  # type: ignore[arg-type]


def idle(ids: Sequence[str]) -> dict[str, EngineMetrics]:
    return {i: EngineMetrics(waiting=0, running=0, kv_usage=0.1) for i in ids}


SYSTEM = list(range(1000, 1000 + 64 * BS))  # a 1,024-token shared system prompt


def test_routes_to_the_endpoint_holding_the_prefix_and_says_why(
    endpoint: EndpointFactory,
) -> None:
    snap = EndpointSnapshot(tuple(endpoint(i, role="aggregated") for i in ("a", "b", "c")))
    index = PrefixIndex()
    cache(index, "b", SYSTEM)
    inputs = RoutingInputs(snap, load_view(idle(["a", "b", "c"])), index)
    decision = EndpointPicker(RoutingSettings()).pick(
        request("r1", [*SYSTEM, 5, 6, 7]), inputs, random.Random(0)
    )
    assert decision.endpoint.id == "b"
    assert decision.prefill is None and not decision.pd.disaggregate
    assert (decision.cached_blocks, decision.total_blocks) == (64, 64)
    assert decision.scores[0].endpoint_id == "b"
    assert decision.scores[0].total > decision.scores[1].total
    assert dict(decision.scores[0].parts)["prefix_cache"] == 1.0
    assert "b: score" in decision.reason and "64/64 prompt blocks cached" in decision.reason
    assert "aggregated endpoint" in decision.reason


def test_load_decides_between_equal_prefixes(endpoint: EndpointFactory) -> None:
    snap = EndpointSnapshot(tuple(endpoint(i, role="aggregated") for i in ("a", "b")))
    index = PrefixIndex()
    cache(index, "a", SYSTEM)
    cache(index, "b", SYSTEM)
    metrics = {
        "a": EngineMetrics(waiting=6, running=8, kv_usage=0.9),
        "b": EngineMetrics(waiting=0, running=8, kv_usage=0.3),
    }
    inputs = RoutingInputs(snap, load_view(metrics), index)
    decision = EndpointPicker(RoutingSettings()).pick(
        request("r", SYSTEM), inputs, random.Random(0)
    )
    assert decision.endpoint.id == "b"


@pytest.mark.parametrize(
    ("prompt_extra", "prefill_version", "expect_prefill", "says"),
    [
        (4096, "v1", "p1", "prefill remotely on weights version v1"),
        (100, "v1", None, "< minUncachedTokens 2048: decode prefills locally"),
        (4096, "v0", None, "no prefill endpoint can take it on weights version v1"),
    ],
)
def test_pd_pairs_a_decode_with_a_same_version_prefill(
    endpoint: EndpointFactory,
    prompt_extra: int,
    prefill_version: str,
    expect_prefill: str | None,
    says: str,
) -> None:
    snap = EndpointSnapshot(
        (endpoint("d1", version="v1"), endpoint("p1", role="prefill", version=prefill_version))
    )
    inputs = RoutingInputs(snap, load_view(), PrefixIndex())
    tokens = list(range(prompt_extra))
    decision = EndpointPicker(RoutingSettings()).pick(
        request("r", tokens), inputs, random.Random(0)
    )
    assert decision.endpoint.id == "d1"
    assert (decision.prefill.id if decision.prefill else None) == expect_prefill
    assert says in decision.pd.reason and says in decision.reason
    if expect_prefill:
        assert decision.prefill is not None
        assert decision.prefill.weights_version == decision.endpoint.weights_version
        assert [s.endpoint_id for s in decision.prefill_scores] == ["p1"]


def test_cached_prefix_on_decode_avoids_remote_prefill(endpoint: EndpointFactory) -> None:
    snap = EndpointSnapshot((endpoint("d1"), endpoint("p1", role="prefill")))
    index = PrefixIndex()
    long_prompt = list(range(3000))
    cache(index, "d1", long_prompt)
    inputs = RoutingInputs(snap, load_view(), index)
    decision = EndpointPicker(RoutingSettings()).pick(
        request("r", [*long_prompt, 1, 2, 3]), inputs, random.Random(0)
    )
    assert decision.pd.cached_tokens == 2992 and decision.prefill is None


def test_during_a_rolling_update_prefill_and_decode_versions_always_match(
    endpoint: EndpointFactory,
) -> None:
    snap = EndpointSnapshot(
        (
            endpoint("d1", version="v1"),
            endpoint("d2", version="v2"),
            endpoint("p1", role="prefill", version="v1"),
            endpoint("p2", role="prefill", version="v2"),
        )
    )
    inputs = RoutingInputs(snap, load_view(), PrefixIndex())
    picker = EndpointPicker(RoutingSettings())
    seen = Counter[tuple[str, str]]()
    for seed in range(40):
        d = picker.pick(request(f"r{seed}", list(range(5000))), inputs, random.Random(seed))
        assert d.prefill is not None
        assert d.prefill.weights_version == d.endpoint.weights_version
        seen[(d.endpoint.id, d.prefill.id)] += 1
    assert set(seen) == {("d1", "p1"), ("d2", "p2")}


def test_pinned_version_and_excluded_endpoints_are_respected(endpoint: EndpointFactory) -> None:
    snap = EndpointSnapshot(
        (endpoint("d1", version="v1"), endpoint("d2", version="v1"), endpoint("d3", version="v2"))
    )
    index = PrefixIndex()
    cache(index, "d1", SYSTEM)
    inputs = RoutingInputs(snap, load_view(), index)
    migrated = request("r", SYSTEM, weights_version="v1", exclude=["d1"])
    for seed in range(10):
        assert (
            EndpointPicker(RoutingSettings())
            .pick(migrated, inputs, random.Random(seed))
            .endpoint.id
            == "d2"
        )


def test_no_endpoint_error_says_why_each_was_dropped(endpoint: EndpointFactory) -> None:
    snap = EndpointSnapshot(
        (endpoint("d1", draining=True), endpoint("d2", down=True), endpoint("p1", role="prefill"))
    )
    inputs = RoutingInputs(snap, load_view(), PrefixIndex())
    with pytest.raises(NoEndpointError, match=r"d1: draining; d2: marked down"):
        EndpointPicker(RoutingSettings()).pick(request("r9", [1]), inputs, random.Random(0))
    empty = RoutingInputs(EndpointSnapshot(), load_view(), PrefixIndex())
    with pytest.raises(NoEndpointError, match="no decode or aggregated endpoint is known"):
        EndpointPicker(RoutingSettings()).pick(request("r9", [1]), empty, random.Random(0))


def test_session_affinity_sticks_until_the_endpoint_is_hot(endpoint: EndpointFactory) -> None:
    settings = RoutingSettings()
    state = RouterState(settings)
    snap = EndpointSnapshot(tuple(endpoint(i, role="aggregated") for i in ("a", "b", "c")))
    state.on_endpoints(snap)
    picker = EndpointPicker(settings)
    state.sessions.record("conv-1", "c")
    state.load.begin("c")  # c is a little busier (1 vs 0, 0), but the session stays
    first = picker.pick(
        request("r1", [1, 2], session_token="conv-1"), state.inputs(snap, 0), random.Random(0)
    )
    assert first.endpoint.id == "c"
    state.load.begin("c")  # 2 > mean 0.67 × 1.2 + 1: hot
    spilled = picker.pick(
        request("r2", [1, 2], session_token="conv-1"), state.inputs(snap, 0), random.Random(0)
    )
    assert spilled.endpoint.id != "c" and spilled.spilled_from == ("c",)
    assert "spilled from hot c" in spilled.reason


def simulate_shared_prompt(settings: RoutingSettings, n_requests: int = 100) -> Counter[str]:
    """n requests sharing SYSTEM over 4 aggregated endpoints; none finishes (in-flight grows).

    Each engine reports the prompt's blocks as cached once it has served one (KV events).
    """
    state = RouterState(settings)
    ids = ("e0", "e1", "e2", "e3")
    snap = EndpointSnapshot(
        tuple(
            Endpoint(id=i, url=f"http://{i}", role="aggregated", weights_version="v1") for i in ids
        )
    )
    state.on_endpoints(snap)
    for i in ids:  # scraped once: equal and idle; the router's own count is what moves
        state.load.record_scrape(i, EngineMetrics(waiting=0, running=0, kv_usage=0.1), at=0.0)
    cache(state.prefix, "e0", SYSTEM)  # e0 served the system prompt first
    picker = EndpointPicker(settings)
    sent = Counter[str]()
    for n in range(n_requests):
        user = [50_000 + n * 100 + k for k in range(2 * BS)]
        req = request(f"r{n}", [*SYSTEM, *user])
        decision = picker.pick(req, state.inputs(snap, now=1.0), random.Random(n))
        target = decision.endpoint.id
        sent[target] += 1
        state.load.begin(target)
        cache(state.prefix, target, [*SYSTEM, *user])
    return sent


def test_a_shared_system_prompt_spreads_over_the_fleet() -> None:
    sent = simulate_shared_prompt(RoutingSettings(spill_margin=0.2))
    assert sum(sent.values()) == 100
    assert max(sent.values()) <= 40, sent
    assert len(sent) == 4


def test_without_the_spill_rule_the_prefix_holder_takes_everything() -> None:
    # The control: a margin so wide nothing is ever hot reproduces the reference hot spot.
    sent = simulate_shared_prompt(RoutingSettings(spill_margin=10.0))
    assert sent["e0"] >= 90, sent


def test_active_active_replicas_make_the_same_decisions(endpoint: EndpointFactory) -> None:
    settings = RoutingSettings()
    snap = EndpointSnapshot(tuple(endpoint(f"d{i}") for i in range(6)))
    rng = random.Random(42)
    prompts = [[rng.randrange(30_000) for _ in range(rng.randrange(16, 600))] for _ in range(30)]
    batches = []
    for n, prompt in enumerate(prompts):
        hashes = HASHER.hash_blocks(prompt)
        if hashes:
            event = BlockStored(tuple(hashes), None, tuple(prompt[: len(hashes) * BS]), BS)
            batches.append((f"d{n % 6}", DecodedBatch(0.0, (event,), 0)))
    replicas = [RouterState(settings), RouterState(settings)]
    for state in replicas:
        state.on_endpoints(snap)
    # Each replica hears the endpoints' streams interleaved differently.
    for endpoint_id, batch in batches:
        replicas[0].prefix.apply_batch(endpoint_id, batch)
    for endpoint_id, batch in sorted(batches, key=lambda b: b[0], reverse=True):
        replicas[1].prefix.apply_batch(endpoint_id, batch)
    metrics = {f"d{i}": EngineMetrics(waiting=i % 3, running=2, kv_usage=0.1 * i) for i in range(6)}
    view = load_view(metrics, {"d0": 2, "d3": 1})
    pickers = [EndpointPicker(settings), EndpointPicker(settings)]
    decisions = [[], []]  # type: list[list[tuple[str, int, str | None]]]
    for k in range(120):
        prompt = [*prompts[k % 30][: 16 + (k * 37) % 500], k]
        req = request(f"req-{k}", prompt)
        for r in (0, 1):
            inputs = RoutingInputs(snap, view, replicas[r].prefix, replicas[r].sessions)
            d = pickers[r].pick(req, inputs, random.Random(req.request_id))
            decisions[r].append(
                (d.endpoint.id, d.cached_blocks, d.prefill.id if d.prefill else None)
            )
    assert decisions[0] == decisions[1]
    assert len({d[0] for d in decisions[0]}) > 1  # the test routes somewhere, not one place
    assert any(d[1] > 0 for d in decisions[0])  # and prefix hits steer it


def test_approximate_mode_learns_from_its_own_routing(endpoint: EndpointFactory) -> None:
    settings = RoutingSettings(prefix_scorer="approximate")
    state = RouterState(settings)
    snap = EndpointSnapshot(tuple(endpoint(i, role="aggregated") for i in ("a", "b", "c")))
    state.on_endpoints(snap)
    picker = EndpointPicker(settings)
    system = "You are a meticulous code reviewer. " * 40
    first = features_from_text("r1", system + "Review this diff.")
    d1 = picker.pick(first, state.inputs(snap, 0), random.Random(3))
    state.remember(d1, first)
    for n in range(5):
        follow = features_from_text(f"r{n + 2}", system + f"Another question {n}.")
        d = picker.pick(follow, state.inputs(snap, 0), random.Random(n))
        assert d.endpoint.id == d1.endpoint.id
        assert d.cached_blocks == len(system) // 64


def test_weighted_picker_reaches_every_candidate(endpoint: EndpointFactory) -> None:
    snap = EndpointSnapshot(tuple(endpoint(i, role="aggregated") for i in ("a", "b")))
    inputs = RoutingInputs(snap, load_view(idle(["a", "b"])), PrefixIndex())
    picker = EndpointPicker(RoutingSettings(picker="weighted"))
    picks = {
        picker.pick(request("r", [1]), inputs, random.Random(s)).endpoint.id for s in range(30)
    }
    assert picks == {"a", "b"}


def test_decision_explains_the_chosen_and_the_best_others(endpoint: EndpointFactory) -> None:
    ids = [f"a{i:02d}" for i in range(20)]
    snap = EndpointSnapshot(tuple(endpoint(i, role="aggregated") for i in ids))
    index = PrefixIndex()
    cache(index, "a07", SYSTEM)
    inputs = RoutingInputs(snap, load_view(idle(ids)), index)
    decision = EndpointPicker(RoutingSettings(debug_scores=5)).pick(
        request("r", SYSTEM), inputs, random.Random(0)
    )
    assert decision.endpoint.id == "a07"
    assert len(decision.scores) == 5
    assert decision.scores[0].endpoint_id == "a07"
    totals = [s.total for s in decision.scores]
    assert totals == sorted(totals, reverse=True)
    names = [n for n, _ in decision.scores[0].parts]
    assert names == [
        "prefix_cache", "queue", "kv_cache_utilization", "in_flight", "session_affinity"
    ]  # fmt: skip


def offload(index: PrefixIndex, endpoint_id: str, tokens: Sequence[int]) -> None:
    """The engine evicted the prompt's blocks from its device pool into its host KV tier."""
    hashes = tuple(HASHER.hash_blocks(tokens))
    events = (
        BlockStored(hashes, None, (), BS, medium="CPU"),
        BlockRemoved(hashes, medium="GPU"),
    )
    index.apply_batch(endpoint_id, DecodedBatch(0.0, events, 0))


def test_host_tier_hits_score_discounted_by_host_hit_weight(endpoint: EndpointFactory) -> None:
    snap = EndpointSnapshot(tuple(endpoint(i, role="aggregated") for i in ("gpu", "cpu", "none")))
    index = PrefixIndex(hasher=HASHER)
    cache(index, "gpu", SYSTEM)
    cache(index, "cpu", SYSTEM)
    offload(index, "cpu", SYSTEM)  # all 64 blocks went to its host tier
    inputs = RoutingInputs(snap, load_view(idle(["gpu", "cpu", "none"])), index)
    decision = EndpointPicker(RoutingSettings(host_hit_weight=0.5)).pick(
        request("r", SYSTEM), inputs, random.Random(0)
    )
    prefix = {s.endpoint_id: dict(s.parts)["prefix_cache"] for s in decision.scores}
    assert prefix == {"gpu": 1.0, "cpu": 0.5, "none": 0.0}
    assert decision.endpoint.id == "gpu"
    # Counted in full, a host hit is as good as a device hit.
    full = EndpointPicker(RoutingSettings(host_hit_weight=1.0)).pick(
        request("r", SYSTEM), inputs, random.Random(0)
    )
    assert {s.endpoint_id: dict(s.parts)["prefix_cache"] for s in full.scores}["cpu"] == 1.0


def test_host_hit_weight_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"host_hit_weight must be in \[0, 1\]"):
        RoutingSettings(host_hit_weight=1.5)
