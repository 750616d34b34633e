"""The `loom up` planner shell keeps which workers stay: a scale-down lets the least busy worker
leave (not the highest index), says so in its event, and the fleet it applies runs exactly the
kept slots; a scale-up fills the lowest free index. Each decision lands in the planner's metrics,
and a role the planner stops moving leaves them. The planner's decision itself is a stand-in
(its own tests are tests/operator/fleet/test_autoscale.py): this tests the shell's choice."""

from __future__ import annotations

import asyncio
from typing import Any

from loom_operator.control.planner_metrics import PlannerMetrics
from loom_operator.fleet.autoscale import AutoscalePlan, AutoscalePolicy, RoleBounds, RoleDecision
from loom_operator.fleet.desired import DesiredFleet, RoleTarget
from loom_operator.fleet.observed import FleetObservation
from loom_operator.local.autoscaler import LocalAutoscaler, autoscaler_for
from loom_operator.local.events import FleetEvent
from loom_runtime.control_api.status import WorkerStatus


class DecidesTo:
    """Stand-in for the shared planner shell: decides `desired` decode workers every round."""

    def __init__(self, desired: int) -> None:
        self.desired = desired
        self.last: AutoscalePlan | None = None

    async def decide(self, replicas: dict[str, int], *_: Any) -> AutoscalePlan:
        d = RoleDecision("decode", replicas["decode"], self.desired, "Test", "stand-in", 0)
        self.last = AutoscalePlan((d,), {})
        return self.last


def status(in_flight: int) -> WorkerStatus:
    return WorkerStatus("tiny", "decode", "v1", "serving", True, in_flight, in_flight, 0, 0.1,
                        64, 32, 16)  # fmt: skip


POLICY = AutoscalePolicy(roles={"decode": RoleBounds(1, 4)})


def card_of(decode: int, policy: AutoscalePolicy | None = POLICY) -> DesiredFleet:
    return DesiredFleet("dep", "decoder", "v1", "file:///m",
                        (RoleTarget("prefill", 1), RoleTarget("decode", decode)),
                        autoscale=policy)  # fmt: skip


def shell(
    decode: int, metrics: PlannerMetrics | None = None
) -> tuple[LocalAutoscaler, DesiredFleet, list[FleetEvent]]:
    card, events = card_of(decode), list[FleetEvent]()
    auto = LocalAutoscaler(POLICY, card, events.append, metrics or PlannerMetrics())
    return auto, card, events


def decide(auto: LocalAutoscaler, desired: int, busy: dict[str, int]) -> None:
    auto._planner = DecidesTo(desired)  # type: ignore[assignment]
    statuses = {name: status(n) for name, n in busy.items()}
    asyncio.run(auto.decide({}, FleetObservation((), 0.0), statuses, 0, 0.0))


def test_the_least_busy_decode_worker_leaves_and_a_new_one_fills_the_hole() -> None:
    auto, card, events = shell(decode=3)
    decide(auto, 2, {"dep-decode-0": 4, "dep-decode-1": 0, "dep-decode-2": 7})
    fleet = auto.apply(card)
    assert [s.name for s in fleet.slots if s.role == "decode"] == ["dep-decode-0", "dep-decode-2"]
    assert fleet.replicas("decode") == 2 and fleet.replicas("prefill") == 1
    assert "scaling down decode 3 → 2" in events[-1].message
    assert "leaving: dep-decode-1 (the least busy)" in events[-1].message
    decide(auto, 3, {})
    assert [s.name for s in auto.apply(card).slots if s.role == "decode"] == [
        "dep-decode-0", "dep-decode-1", "dep-decode-2"]  # fmt: skip


def test_idle_workers_leave_from_the_highest_index_as_before() -> None:
    auto, card, _ = shell(decode=3)
    decide(auto, 1, {"dep-decode-0": 0, "dep-decode-1": 0, "dep-decode-2": 0})
    assert [s.name for s in auto.apply(card).slots if s.role == "decode"] == ["dep-decode-0"]


def sample(metrics: PlannerMetrics, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(
        name, {"namespace": "", "deployment": "dep", **labels}
    )
    return value


def test_each_decision_is_in_the_planner_metrics_until_the_role_is_no_longer_planned() -> None:
    metrics = PlannerMetrics()
    auto, _, _ = shell(decode=3, metrics=metrics)
    decide(auto, 2, {"dep-decode-0": 1, "dep-decode-1": 0, "dep-decode-2": 1})
    decide(auto, 2, {})
    assert sample(metrics, "loom:operator_planned_replicas", role="decode") == 2
    assert sample(metrics, "loom:operator_role_desired_replicas", role="decode") == 2
    total = "loom:operator_autoscale_decisions_total"
    assert sample(metrics, total, role="decode", reason="Test") == 2
    assert b'loom:operator_planned_replicas{deployment="dep"' in metrics.exposition()
    assert autoscaler_for(card_of(2), auto, print, metrics) is auto  # the same policy: kept
    assert autoscaler_for(card_of(2, policy=None), auto, print, metrics) is None
    assert sample(metrics, "loom:operator_planned_replicas", role="decode") is None
    assert sample(metrics, "loom:operator_role_desired_replicas", role="decode") is None
