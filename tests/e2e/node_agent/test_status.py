from __future__ import annotations

import pytest
from e2e.node_agent.status import ContainerView, Terminated, phase, pod_status, restart_backoff


def view(state: str, **kw: object) -> ContainerView:
    return ContainerView("c", "img", state, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("views", "policy", "expected"),
    [
        ([view("waiting")], "Always", "Pending"),
        ([view("running")], "Always", "Running"),
        ([view("waiting", restart_count=2, reason="CrashLoopBackOff")], "Always", "Running"),
        ([view("terminated", terminated=Terminated(0, "Completed", 0, 1))], "Never", "Succeeded"),
        ([view("terminated", terminated=Terminated(2, "Error", 0, 1))], "Never", "Failed"),
        (
            [view("terminated", terminated=Terminated(0, "Completed", 0, 1))],
            "OnFailure",
            "Succeeded",
        ),
        ([view("running"), view("waiting")], "Always", "Pending"),
    ],
)
def test_phase(views: list[ContainerView], policy: str, expected: str) -> None:
    assert phase(views, policy) == expected


def test_ready_needs_every_container_ready_and_keeps_transition_times() -> None:
    first = pod_status(
        [view("running", ready=True), view("running")], "Always", "127.0.10.2", 0.0, None
    )
    ready = {c["type"]: c for c in first["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ContainersNotReady"
    previous = {"conditions": [dict(ready, lastTransitionTime="2000-01-01T00:00:00Z")]}
    again = pod_status(
        [view("running", ready=True), view("running")], "Always", "127.0.10.2", 0.0, None, previous
    )
    assert {c["type"]: c for c in again["conditions"]}["Ready"][
        "lastTransitionTime"
    ] == "2000-01-01T00:00:00Z"
    both = pod_status(
        [view("running", ready=True)] * 2, "Always", "127.0.10.2", 0.0, None, previous
    )
    assert {c["type"]: c for c in both["conditions"]}["Ready"]["status"] == "True"
    assert both["podIP"] == "127.0.10.2"


def test_container_status_shapes() -> None:
    last = Terminated(3, "Error", 0.0, 1.0)
    waiting = pod_status(
        [view("waiting", restart_count=1, reason="CrashLoopBackOff", last=last)],
        "Always",
        "ip",
        0,
        None,
    )
    cs = waiting["containerStatuses"][0]
    assert cs["state"] == {"waiting": {"reason": "CrashLoopBackOff"}}
    assert cs["lastState"]["terminated"]["exitCode"] == 3 and cs["restartCount"] == 1


def test_back_off_doubles_and_is_capped() -> None:
    assert [restart_backoff(n, 10.0) for n in (1, 2, 3, 4)] == [10.0, 20.0, 40.0, 80.0]
    assert restart_backoff(20, 10.0) == 300.0
