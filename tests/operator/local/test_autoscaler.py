"""The `loom up` planner shell keeps which workers stay: a scale-down lets the least busy worker
leave (not the highest index), says so in its event, and the fleet it applies runs exactly the
kept slots; a scale-up fills the lowest free index. The planner's decision itself is a stand-in
(its own tests are tests/operator/fleet/test_autoscale.py): this tests the shell's choice."""

from __future__ import annotations

import asyncio
from typing import Any

from loom_operator.fleet.autoscale import AutoscalePlan, AutoscalePolicy, RoleBounds, RoleDecision
from loom_operator.fleet.desired import DesiredFleet, RoleTarget
from loom_operator.fleet.observed import FleetObservation
from loom_operator.local.autoscaler import LocalAutoscaler
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


def shell(decode: int) -> tuple[LocalAutoscaler, DesiredFleet, list[FleetEvent]]:
    card = DesiredFleet("dep", "decoder", "v1", "file:///m",
                        (RoleTarget("prefill", 1), RoleTarget("decode", decode)))  # fmt: skip
    policy = AutoscalePolicy(roles={"decode": RoleBounds(1, 4)})
    events: list[FleetEvent] = []
    return LocalAutoscaler(policy, card, events.append), card, events


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
