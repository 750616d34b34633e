"""When a card's fleet round runs: on its first look, when anything it reads changed (but not
a healthy worker's time of last answer), and once the time the core or the planner asked for
has come; and how long a daemon waits for a watch between looks."""

from __future__ import annotations

import pytest

from loom_operator.fleet.observed import FleetObservation, WorkerState
from loom_operator.k8s.round_inputs import (
    BUSY_S,
    PROBE_S,
    RoundInputs,
    digest,
    look_delay,
    next_due,
    object_versions,
    round_due,
    round_inputs,
)


def observed(now: float, last_seen: float, ready: bool = True) -> FleetObservation:
    w = WorkerState(name="c-decode-0", role="decode", weights_version="v1", ready=ready,
                    last_seen=last_seen)  # fmt: skip
    return FleetObservation((w,), now)


def pod(name: str, version: str) -> dict[str, object]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def inputs(
    generation: int = 1,
    model: dict[str, object] | None = None,
    pods: tuple[tuple[str, str], ...] = (("c-decode-0", "7"),),
    seen: FleetObservation | None = None,
    loading: bool = False,
) -> RoundInputs:
    objects = object_versions("Pod", [pod(n, v) for n, v in pods])
    return round_inputs(generation, "Progressing", model or {"spec": {"a": 1}}, objects,
                        seen or observed(100.0, 99.0), loading)  # fmt: skip


def test_the_first_look_runs_a_round() -> None:
    assert round_due(None, inputs(), None, 100.0)


def test_a_later_answer_of_a_healthy_worker_is_no_change() -> None:
    last = inputs(seen=observed(100.0, 99.0))
    assert not round_due(last, inputs(seen=observed(102.0, 101.5)), None, 102.0)


@pytest.mark.parametrize(
    "changed",
    [
        inputs(generation=2),
        inputs(model={"spec": {"a": 2}}),
        inputs(pods=(("c-decode-0", "8"),)),
        inputs(pods=(("c-decode-0", "7"), ("c-decode-1", "9"))),
        inputs(seen=observed(102.0, 99.0, ready=False)),
        inputs(loading=True),
    ],
    ids=["generation", "model card", "pod written", "pod added", "probe result", "loading"],
)
def test_a_change_of_what_the_round_reads_runs_it(changed: RoundInputs) -> None:
    assert round_due(inputs(), changed, None, 102.0)


def test_a_round_asked_for_runs_once_its_time_has_come() -> None:
    same = inputs()
    assert not round_due(same, same, 105.0, 104.9)
    assert round_due(same, same, 105.0, 105.0)


def test_the_next_round_is_due_soon_after_acting_else_at_the_earliest_time_asked() -> None:
    assert next_due(True, None, None, 100.0) == pytest.approx(100.0 + BUSY_S)
    assert next_due(False, 130.0, 110.0, 100.0) == 110.0
    assert next_due(True, 100.1, None, 100.0) == 100.1
    assert next_due(False, None, None, 100.0) is None


def test_a_daemon_looks_at_least_every_probe_period_and_at_the_due_time() -> None:
    assert look_delay(None, 100.0, 100.5) == pytest.approx(PROBE_S - 0.5)
    assert look_delay(100.8, 100.0, 100.5) == pytest.approx(0.3)
    assert look_delay(99.0, 100.0, 100.5) == 0.0


def test_object_versions_and_digests_do_not_depend_on_order() -> None:
    a = object_versions("Pod", [pod("b", "2"), pod("a", "1")])
    assert a == [("Pod", "a", "1"), ("Pod", "b", "2")]
    assert digest({"x": 1, "y": [1, 2]}) == digest({"y": [1, 2], "x": 1}) != digest({"x": 2})
    assert digest(None) == ""
