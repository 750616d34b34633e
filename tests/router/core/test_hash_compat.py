"""The router predicts exactly the prefix hits the engine will have: same hashes, same blocks.

The engine side is the real runtime block pool and allocator emitting KV events; the events
travel through the wire codec and the router's decoder, as they would over ZMQ.
"""

from __future__ import annotations

import random

import pytest

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.local.launch import router_document
from loom_router.core.endpoints import Endpoint, EndpointSnapshot
from loom_router.core.kv_events import decode_message
from loom_router.core.pd_decider import cached_tokens
from loom_router.core.pipeline import EndpointPicker
from loom_router.core.request import features_from_tokens
from loom_router.core.settings import RoutingSettings
from loom_router.core.state import RouterState
from loom_router.shell.config import file_config_from_dict
from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.wire.kv_event_codec import encode_batch
from loom_runtime.wire.kv_events import EventBuffer
from loom_runtime.wire.prefix_hash import PrefixHasher


def settings_from_card(card: DeploymentCard) -> RoutingSettings:
    """What the router runs with for `card`: the ROUTER.json the operator writes, as read back."""
    return file_config_from_dict(router_document(card, "tiny", None)).settings


SEED = "1234"


class Engine:
    """The engine's KV accounting with its event stream, as a worker runs it."""

    def __init__(self, seed: str, block_size: int = 16, layout: str = "map", fmt: str = "int"):
        self.events = EventBuffer()
        self.pool = BlockPool(256, block_size, events=self.events)
        self.kv = KVAllocator(self.pool, PrefixHasher(block_size, seed=seed))
        self.layout, self.fmt, self.seq = layout, fmt, 0

    def serve(self, tokens: list[int], cache_salt: str | None = None) -> None:
        table = BlockTable(cache_salt=cache_salt)
        assert self.kv.admit(table, tokens, len(tokens))
        self.kv.commit(table, tokens)
        self.kv.free(table)

    def frames(self) -> list[bytes]:
        payload = encode_batch(
            0.0,
            self.events.take(),
            0,
            layout=self.layout,  # type: ignore[arg-type]
            hash_format=self.fmt,  # type: ignore[arg-type]
        )
        self.seq += 1
        return [b"kv-events", (self.seq - 1).to_bytes(8, "big"), payload]


def card_settings() -> RoutingSettings:
    card = DeploymentCard.model_validate(
        {
            "apiVersion": "loom.dev/v1alpha1",
            "kind": "DeploymentCard",
            "metadata": {"name": "tiny"},
            "spec": {
                "modelCard": "tiny",
                "roles": {"aggregated": {"replicas": 2}},
                "prefixCaching": {"hashSeed": SEED},
            },
        }
    )
    return settings_from_card(card)


@pytest.mark.parametrize("layout", ["map", "array"])
@pytest.mark.parametrize("fmt", ["int", "bytes"])
def test_router_predicts_the_engines_prefix_hits(layout: str, fmt: str) -> None:
    state = RouterState(card_settings())
    engine = Engine(SEED, layout=layout, fmt=fmt)
    rng = random.Random(0)
    system = [rng.randrange(1000) for _ in range(100)]
    engine.serve([*system, 7, 8, 9])
    state.prefix.apply_message("e1", decode_message(engine.frames()))

    follow_up = system + [rng.randrange(1000) for _ in range(40)]
    features = features_from_tokens("r1", follow_up, state.hasher)
    matched = state.prefix.match(["e1"], features.block_keys)["e1"]
    predicted = cached_tokens(matched, state.settings.block_size, len(follow_up))
    assert predicted == engine.kv.match(follow_up) == 96  # 6 full blocks of the shared 100
    assert not state.prefix.stats().hash_problems


def test_cache_salt_is_part_of_the_hash_on_both_sides() -> None:
    state = RouterState(card_settings())
    engine = Engine(SEED)
    tokens = list(range(64))
    engine.serve(tokens, cache_salt="tenant-a")
    state.prefix.apply_message("e1", decode_message(engine.frames()))
    salted = features_from_tokens("r", [*tokens, 1], state.hasher, cache_salt="tenant-a")
    plain = features_from_tokens("r", [*tokens, 1], state.hasher)
    assert state.prefix.match(["e1"], salted.block_keys) == {"e1": 4}
    assert state.prefix.match(["e1"], plain.block_keys) == {"e1": 0}


def test_an_engine_with_another_seed_is_reported_not_silently_zero() -> None:
    state = RouterState(card_settings())
    engine = Engine(seed="0")  # the card says 1234
    engine.serve(list(range(64)))
    state.prefix.apply_message("e1", decode_message(engine.frames()))
    problem = state.prefix.stats().hash_problems["e1"]
    assert "hashSeed" in problem and "'1234'" in problem


def test_events_route_the_request_to_the_endpoint_holding_the_prefix() -> None:
    settings = card_settings()
    state = RouterState(settings)
    engines = {"e1": Engine(SEED), "e2": Engine(SEED)}
    snapshot = EndpointSnapshot(
        tuple(
            Endpoint(id=i, url=f"http://{i}", role="aggregated", weights_version="v1")
            for i in engines
        )
    )
    state.on_endpoints(snapshot)
    prompt = list(range(200, 520))
    engines["e2"].serve(prompt)
    for endpoint_id, engine in engines.items():
        state.prefix.apply_message(endpoint_id, decode_message(engine.frames()))
    picker = EndpointPicker(settings)
    for seed in range(10):  # no tie-break can send it elsewhere
        request = features_from_tokens(f"r{seed}", [*prompt, seed], state.hasher)
        decision = picker.pick(request, state.inputs(snapshot, now=0.0), random.Random(seed))
        assert decision.endpoint.id == "e2"
        assert decision.cached_blocks == 20
    # A weight sync clears e2's cache: the router sees AllBlocksCleared and stops preferring it.
    engines["e2"].kv.reset_prefix_cache()
    state.prefix.apply_message("e2", decode_message(engines["e2"].frames()))
    request = features_from_tokens("r-after", [*prompt, 1], state.hasher)
    decision = picker.pick(request, state.inputs(snapshot, now=0.0), random.Random(0))
    assert decision.cached_blocks == 0
