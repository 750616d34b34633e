from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from loom_router.core.endpoints import (
    Endpoint,
    EndpointSnapshot,
    EndpointSource,
    StaticEndpoints,
)
from loom_router.errors import ConfigError, EndpointError, EndpointExistsError, classify

EndpointFactory = Callable[..., Endpoint]


def test_static_endpoints_satisfy_the_source_protocol() -> None:
    source: EndpointSource = StaticEndpoints()
    assert len(source.snapshot()) == 0


def test_snapshot_is_sorted_by_id_and_indexed(endpoint: EndpointFactory) -> None:
    snap = EndpointSnapshot((endpoint("d2"), endpoint("a1"), endpoint("d1")))
    assert [e.id for e in snap.endpoints] == ["a1", "d1", "d2"]
    assert snap.get("d1") == endpoint("d1")
    assert snap.get("nope") is None


def test_snapshot_refuses_duplicate_ids(endpoint: EndpointFactory) -> None:
    with pytest.raises(ConfigError):
        EndpointSnapshot((endpoint("d1"), endpoint("d1")))


@pytest.mark.parametrize(
    ("operation", "field", "value"),
    [
        ("drain", "draining", True),
        ("mark_down", "down", True),
    ],
)
def test_admin_operation_flips_one_flag_and_back(
    endpoint: EndpointFactory, operation: str, field: str, value: bool
) -> None:
    source = StaticEndpoints([endpoint("d1"), endpoint("d2")])
    snap = getattr(source, operation)("d1")
    assert getattr(snap.by_id["d1"], field) is value
    assert not snap.by_id["d1"].routable
    assert snap.by_id["d2"].routable
    undo = {"drain": "undrain", "mark_down": "mark_up"}[operation]
    back = getattr(source, undo)("d1")
    assert getattr(back.by_id["d1"], field) is not value
    assert back.by_id["d1"].routable
    assert back.generation == 2


def test_add_remove_update_change_the_snapshot(endpoint: EndpointFactory) -> None:
    source = StaticEndpoints([endpoint("d1")])
    source.add(endpoint("p1", role="prefill"))
    assert set(source.snapshot().by_id) == {"d1", "p1"}
    source.update(endpoint("d1", version="v2"))
    assert source.snapshot().by_id["d1"].weights_version == "v2"
    source.set_ready("p1", False)
    assert not source.snapshot().by_id["p1"].ready
    source.remove("p1")
    assert set(source.snapshot().by_id) == {"d1"}
    assert source.snapshot().generation == 4


def test_unknown_or_duplicate_endpoints_are_typed_errors(endpoint: EndpointFactory) -> None:
    source = StaticEndpoints([endpoint("d1")])
    with pytest.raises(EndpointExistsError, match="exists") as taken:
        source.add(endpoint("d1"))
    assert classify(taken.value).status == 409  # not a 404: the id is there
    for operation in ("remove", "drain", "undrain", "mark_down", "mark_up"):
        with pytest.raises(EndpointError) as missing:
            getattr(source, operation)("ghost")
        assert classify(missing.value).status == 404
    for operation in ("remove", "drain", "undrain", "mark_down", "mark_up"):
        with pytest.raises(EndpointError, match="no endpoint 'ghost'"):
            getattr(source, operation)("ghost")
    with pytest.raises(EndpointError):
        source.update(endpoint("ghost"))
    assert source.snapshot().generation == 0  # failed operations change nothing


def test_endpoint_count_is_bounded(endpoint: EndpointFactory) -> None:
    source = StaticEndpoints([endpoint("d1")], max_endpoints=1)
    with pytest.raises(ConfigError):
        source.add(endpoint("d2"))


def test_listeners_get_every_snapshot_in_order_until_unsubscribed(
    endpoint: EndpointFactory,
) -> None:
    source = StaticEndpoints([endpoint("d1")])
    seen: list[int] = []
    unsubscribe = source.subscribe(lambda snap: seen.append(snap.generation))
    source.drain("d1")
    source.undrain("d1")
    unsubscribe()
    source.mark_down("d1")
    assert seen == [1, 2]


def test_a_failing_listener_does_not_stop_others_or_the_change(endpoint: EndpointFactory) -> None:
    source = StaticEndpoints([endpoint("d1")])
    seen: list[bool] = []

    def broken(_: EndpointSnapshot) -> None:
        raise RuntimeError("listener bug")

    source.subscribe(broken)
    source.subscribe(lambda snap: seen.append(snap.by_id["d1"].down))
    source.mark_down("d1")
    assert seen == [True]
    assert source.snapshot().by_id["d1"].down


def test_concurrent_operations_lose_no_update_and_deliver_in_order(
    endpoint: EndpointFactory,
) -> None:
    source = StaticEndpoints()
    seen: list[int] = []
    source.subscribe(lambda snap: seen.append(snap.generation))

    def add_many(prefix: str) -> None:
        for i in range(50):
            source.add(endpoint(f"{prefix}{i}"))

    threads = [threading.Thread(target=add_many, args=(p,)) for p in ("a", "b", "c", "d")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(source.snapshot()) == 200
    assert seen == list(range(1, 201))


def test_endpoint_validates_its_fields() -> None:
    with pytest.raises(ConfigError):
        Endpoint(id="", url="http://x", role="decode", weights_version="v1")
    with pytest.raises(ConfigError):
        Endpoint(id="x", url="http://x", role="encoder", weights_version="v1")  # type: ignore[arg-type]
