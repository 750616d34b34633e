"""A DeploymentCard's status from its StatefulSets and pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loom_operator.api.documents import load_documents
from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.record import FleetRecord, SyncRecord, WorkerProgress
from loom_operator.k8s.status import deployment_status, with_fleet, with_transition_times

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
(DEPLOYMENT,) = load_documents(EXAMPLES / "tiny-pd.yaml").deployment_cards


def pod(
    name: str, role: str | None, revision: str, ready: bool = True, **kw: Any
) -> dict[str, Any]:
    labels = {"loom.dev/deployment": "tiny-pd", "controller-revision-hash": revision}
    labels |= {"loom.dev/role": role} if role else {"app.kubernetes.io/component": "router"}
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]
    }
    if "waiting" in kw:
        status["containerStatuses"] = [
            {"restartCount": 3, "state": {"waiting": {"reason": kw["waiting"]}}}
        ]
    return {"metadata": {"name": name, "labels": labels,
                         "annotations": {"loom.dev/weights-version": kw.get("version", "v1")}},
            "status": status}  # fmt: skip


def sets(revision: str = "r2") -> dict[str, Any]:
    return {f"tiny-pd-{r}": {"status": {"updateRevision": revision}} for r in ("prefill", "decode")}


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def test_ready_when_every_role_and_the_router_serve_the_current_revision() -> None:
    pods = [pod("p-0", "prefill", "r2"), pod("d-0", "decode", "r2"), pod("router-x", None, "")]
    status = deployment_status(DEPLOYMENT, 3, sets(), pods)
    assert status["phase"] == "Ready" and status["readyRoles"] == "2/2"
    assert status["roles"]["decode"] == {"ready": 1, "desired": 1, "weightsVersion": "v1"}
    assert conditions(status) == {
        "Valid": "True",
        "Ready": "True",
        "Progressing": "False",
        "Degraded": "False",
    }
    assert status["observedGeneration"] == 3 and status["weightsVersion"] == "v1"
    assert status["endpoint"] == "http://tiny-pd-router.default.svc:8000/v1"


def test_an_old_revision_pod_never_makes_a_role_ready() -> None:
    pods = [pod("p-0", "prefill", "r2"), pod("d-0", "decode", "r1"), pod("router-x", None, "")]
    status = deployment_status(DEPLOYMENT, 4, sets("r2"), pods)
    assert status["phase"] == "Progressing" and conditions(status)["Ready"] == "False"
    assert status["roles"]["decode"]["ready"] == 0
    assert "decode 0/1" in next(c for c in status["conditions"] if c["type"] == "Ready")["message"]


def test_a_crash_loop_is_degraded_with_the_pod_named() -> None:
    pods = [
        pod("p-0", "prefill", "r2"),
        pod("d-0", "decode", "r2", ready=False, waiting="CrashLoopBackOff"),
    ]
    status = deployment_status(DEPLOYMENT, 1, sets(), pods)
    assert status["phase"] == "Degraded"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "d-0 (3 restarts)" in degraded["message"]


def test_transition_times_carry_over_while_a_status_holds() -> None:
    old = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    same = with_transition_times([{"type": "Ready", "status": "True"}], old)
    flipped = with_transition_times([{"type": "Ready", "status": "False"}], old)
    assert same[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert flipped[0]["lastTransitionTime"] != "2026-01-01T00:00:00Z"


def core(
    ready: tuple[str, str], syncing: bool = False, degraded: bool = False
) -> tuple[SetCondition, ...]:
    return (
        SetCondition("Ready", ready[0], ready[1], "core ready message"),  # type: ignore[arg-type]
        SetCondition(
            "Progressing",
            "True" if syncing else "False",
            "WeightSync" if syncing else "Reconciled",
            "core progress",
        ),
        SetCondition(
            "Degraded",
            "True" if degraded else "False",
            "WorkerFailed" if degraded else "AsExpected",
            "core degraded",
        ),
        SetCondition(
            "WeightSyncing",
            "True" if syncing else "False",
            "Rolling" if syncing else "InSync",
            "syncing 1/2",
        ),
    )


SYNC = FleetRecord(
    sync=SyncRecord(
        "v2",
        "loom://tiny",
        "Rolling",
        1_800_000_000.0,
        (
            WorkerProgress("tiny-pd-decode-0", "resumed"),
            WorkerProgress("tiny-pd-prefill-0", "frozen"),
        ),
    )
)


def joined(
    pods: list[dict[str, Any]], fleet: tuple[SetCondition, ...], record: FleetRecord
) -> dict[str, Any]:
    return with_fleet(
        deployment_status(DEPLOYMENT, 5, sets(), pods), fleet, record, "decoder", "v1", 5
    )


CURRENT = [pod("p-0", "prefill", "r2"), pod("d-0", "decode", "r2"), pod("router-x", None, "")]


def test_ready_needs_the_current_revision_and_every_worker_on_the_target_version() -> None:
    status = joined(CURRENT, core(("True", "AllReplicasReady")), FleetRecord())
    assert status["phase"] == "Ready" and conditions(status)["Ready"] == "True"
    assert FleetRecord.from_json(status["fleetRecord"]) == FleetRecord()
    old = [pod("p-0", "prefill", "r1"), *CURRENT[1:]]
    status = joined(old, core(("True", "AllReplicasReady")), FleetRecord())
    assert conditions(status)["Ready"] == "False"  # an old-revision pod never satisfies Ready


def test_ready_waits_until_the_pods_are_routed_as_the_target_version() -> None:
    unrouted = [pod("p-0", "prefill", "r2", version=""), *CURRENT[1:]]
    status = joined(unrouted, core(("True", "AllReplicasReady")), FleetRecord())
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Routing")


def test_a_fleet_serving_mid_sync_is_not_ready_and_says_why() -> None:
    status = joined(CURRENT, core(("True", "PartiallyReady"), syncing=True), SYNC)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PartiallyReady")
    assert status["phase"] == "WeightSyncing" and conditions(status)["WeightSyncing"] == "True"
    sync = status["weightSync"]
    assert sync["workers"] == {"tiny-pd-decode-0": "Done", "tiny-pd-prefill-0": "Draining"}
    assert (sync["phase"], sync["updated"], sync["total"]) == ("Syncing", 1, 2)
    assert sync["targetVersions"] == {"decoder": "v2"} and sync["message"] == "syncing 1/2"
    assert FleetRecord.from_json(status["fleetRecord"]) == SYNC


def test_a_failed_worker_or_a_crash_loop_is_degraded() -> None:
    status = joined(CURRENT, core(("True", "PartiallyReady"), degraded=True), FleetRecord())
    assert status["phase"] == "Degraded" and conditions(status)["Degraded"] == "True"
    looping = [CURRENT[0], pod("d-0", "decode", "r2", ready=False, waiting="CrashLoopBackOff"),
               CURRENT[2]]  # fmt: skip
    status = joined(looping, core(("False", "NoRoutableWorkers")), FleetRecord())
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "CrashLoop" and "d-0" in degraded["message"]


def test_capacity_lost_without_a_spec_change_is_degraded_until_it_is_back() -> None:
    full = joined(CURRENT, core(("True", "AllReplicasReady")), FleetRecord())
    lost_pods = [CURRENT[0], pod("d-0", "decode", "r2", ready=False), CURRENT[2]]
    fleet = core(("True", "PartiallyReady"))
    lost = with_fleet(deployment_status(DEPLOYMENT, 5, sets(), lost_pods), fleet, FleetRecord(),
                      "decoder", "v1", 5, full)  # fmt: skip
    degraded = next(c for c in lost["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CapacityLost")
    assert "decode 0/1" in degraded["message"] and lost["phase"] == "Degraded"
    still = with_fleet(deployment_status(DEPLOYMENT, 5, sets(), lost_pods), fleet, FleetRecord(),
                       "decoder", "v1", 5, lost)  # fmt: skip
    assert conditions(still)["Degraded"] == "True"  # until the replacement is ready
    back = with_fleet(deployment_status(DEPLOYMENT, 5, sets(), CURRENT), core(("True",
                      "AllReplicasReady")), FleetRecord(), "decoder", "v1", 5, still)  # fmt: skip
    assert conditions(back)["Degraded"] == "False"


def test_a_first_rollout_or_a_scale_up_is_not_lost_capacity() -> None:
    starting = [CURRENT[0], pod("d-0", "decode", "r2", ready=False), CURRENT[2]]
    fresh = deployment_status(DEPLOYMENT, 5, sets(), starting)
    first = with_fleet(
        fresh, core(("False", "NoRoutableWorkers")), FleetRecord(), "decoder", "v1", 5, {}
    )
    assert conditions(first)["Degraded"] == "False"
    full = joined(CURRENT, core(("True", "AllReplicasReady")), FleetRecord())
    partial = core(("True", "PartiallyReady"))
    new_spec = with_fleet(deployment_status(DEPLOYMENT, 6, sets(), starting), partial,
                          FleetRecord(), "decoder", "v1", 6, full)  # fmt: skip
    assert conditions(new_spec)["Degraded"] == "False"  # a spec change, not a loss


def test_workers_paused_by_a_sync_are_not_lost_capacity() -> None:
    full = joined(CURRENT, core(("True", "AllReplicasReady")), FleetRecord())
    paused = [CURRENT[0], pod("d-0", "decode", "r2", ready=False), CURRENT[2]]  # admission closed
    holding = core(("False", "WeightSyncHolding"), syncing=True)
    mid_sync = with_fleet(deployment_status(DEPLOYMENT, 5, sets(), paused), holding, SYNC,
                          "decoder", "v1", 5, full)  # fmt: skip
    assert conditions(mid_sync)["Degraded"] == "False" and mid_sync["phase"] == "WeightSyncing"


def test_desired_per_role_is_the_settled_count_and_kubectl_get_shows_it() -> None:
    pods = [pod("p-0", "prefill", "r2"), pod("d-0", "decode", "r2"), pod("router-x", None, "")]
    status = deployment_status(DEPLOYMENT, 3, sets(), pods, {"prefill": 1, "decode": 3})
    assert status["roles"]["decode"]["desired"] == 3
    assert status["replicas"] == "prefill 1/1, decode 1/3"
    assert status["phase"] == "Progressing"  # two decode workers still to come
    assert deployment_status(DEPLOYMENT, 3, sets(), pods)["replicas"] == "prefill 1/1, decode 1/1"
