"""Actions come out in one deterministic order: traffic away from trouble first, status last."""

from __future__ import annotations

from loom_operator.fleet.actions import (
    Action,
    Freeze,
    LoadWeights,
    MigrateRequests,
    RestartWorker,
    Resume,
    RouteOff,
    RouteOn,
    SetCondition,
    StartWorker,
    StopWorker,
    brings_back,
    ordered,
    takes_out,
)


def test_ordered_puts_route_off_first_and_conditions_last_and_sorts_by_worker() -> None:
    actions: list[Action] = [
        SetCondition("Ready", "True", "AllReplicasReady", ""),
        RouteOn("b"),
        Resume("a"),
        LoadWeights("a", "s", "v2"),
        StartWorker("c", "decode", "s", "v2"),
        RestartWorker("b", "decode", "s", "v2", 1, 1.0, "exited"),
        StopWorker("d", "scaled down"),
        MigrateRequests("b", abort=False, reason="dead"),
        Freeze("z"),
        Freeze("a"),
        RouteOff("b", "dead"),
    ]
    assert [type(a).__name__ + getattr(a, "worker", "") for a in ordered(actions)] == [
        "RouteOffb",
        "Freezea",
        "Freezez",
        "MigrateRequestsb",
        "StopWorkerd",
        "RestartWorkerb",
        "StartWorkerc",
        "LoadWeightsa",
        "Resumea",
        "RouteOnb",
        "SetCondition",
    ]


def test_ordered_drops_exact_duplicates_only() -> None:
    assert ordered([Freeze("a"), Freeze("a"), Freeze("b")]) == (Freeze("a"), Freeze("b"))


def test_takes_out_and_brings_back() -> None:
    assert takes_out(RouteOff("a", "x")) == "a"
    assert takes_out(Freeze("a")) == "a"
    assert takes_out(MigrateRequests("a", abort=True, reason="x")) == "a"
    assert takes_out(MigrateRequests("a", abort=False, reason="x")) is None
    assert takes_out(Resume("a")) is None
    assert brings_back(Resume("a")) == "a" and brings_back(RouteOn("b")) == "b"
    assert brings_back(Freeze("a")) is None
