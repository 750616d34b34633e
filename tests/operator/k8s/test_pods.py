"""Worker pods as the fleet controller sees them, and the patches that route them."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.fleet.conftest import make_worker

from loom_operator.control.probe import Probe, Seen
from loom_operator.fleet.actions import LoadWeights
from loom_operator.fleet.observed import FleetObservation
from loom_operator.k8s.pods import (
    in_flight_by_worker,
    pod_worker,
    rebuild_peer,
    route_patch,
    routed_as,
    unschedulable,
    worker_state,
)
from loom_runtime.control_api.status import WorkerStatus
from loom_runtime.wire.router_admin import EndpointRecord, EndpointSpec


def pod(
    name: str = "tiny-pd-decode-0",
    role: str = "decode",
    annotations: dict[str, str] | None = None,
    state: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    named = {"http": 8000, "control": 50051, "kv-events": 5557}
    container_status: dict[str, Any] = {
        "name": "runtime",
        "restartCount": kw.pop("restarts", 0),
        "state": state or {"running": {"startedAt": "2026-12-02T00:00:10Z"}},
    }
    if "last_exit" in kw:
        container_status["lastState"] = {"terminated": {"finishedAt": kw.pop("last_exit")}}
    return {
        "metadata": {
            "name": name, "uid": kw.pop("uid", "u1"),
            "labels": {"loom.dev/deployment": "tiny-pd", "loom.dev/role": role},
            "annotations": annotations or {}, **kw.pop("meta", {}),
        },
        "spec": {"containers": [{"name": "runtime", "ports": [
            {"name": n, "containerPort": p} for n, p in named.items()]}]},
        "status": {"phase": kw.pop("phase", "Running"), "podIP": kw.pop("ip", "127.9.0.4"),
                   "containerStatuses": [container_status]},
    }  # fmt: skip


def status(version: str = "v1", **kw: Any) -> WorkerStatus:
    fields: dict[str, Any] = dict(model_name="tiny", role="decode", weights_version=version,
                                  state="serving", admission_open=True, in_flight=0, num_running=0,
                                  num_waiting=0, kv_usage=0.0, num_blocks=64,
                                  num_free_blocks=64, block_size=16)  # fmt: skip
    return WorkerStatus(**(fields | kw))


def test_a_running_worker_pod_and_its_addresses() -> None:
    w = pod_worker(pod(annotations={"loom.dev/weights-version": "v1"}, restarts=2,
                       last_exit="2026-12-02T00:00:05Z"))  # fmt: skip
    assert w is not None
    assert (w.name, w.role, w.alive, w.draining, w.routed_version) == (
        "tiny-pd-decode-0",
        "decode",
        True,
        False,
        "v1",
    )
    assert (w.url, w.control, w.restarts) == ("http://127.9.0.4:8000", "127.9.0.4:50051", 2)
    assert w.started_at is not None and w.last_exit_at is not None
    assert w.started_at - w.last_exit_at == 5.0


@pytest.mark.parametrize(
    ("changes", "alive"),
    [
        ({"meta": {"deletionTimestamp": "2026-12-02T00:01:00Z"}}, False),  # Terminating
        ({"phase": "Failed"}, False),
        ({"state": {"waiting": {"reason": "CrashLoopBackOff"}}}, False),
        ({"state": {"terminated": {"exitCode": 1}}}, False),
        ({"state": {"waiting": {"reason": "ContainerCreating"}}, "phase": "Pending"}, True),
    ],
)
def test_terminating_failed_and_crashed_pods_are_not_alive(
    changes: dict[str, Any], alive: bool
) -> None:
    w = pod_worker(pod(**changes))
    assert w is not None and w.alive is alive


def test_pods_that_are_not_workers_are_skipped() -> None:
    router = pod(role="")
    router["metadata"]["labels"].pop("loom.dev/role")
    assert pod_worker(router) is None


def test_a_worker_is_routed_only_as_the_version_it_reports_and_not_draining() -> None:
    probe = Probe(True, status("v2"))
    annotated = {"loom.dev/weights-version": "v1"}
    as_old = worker_state(pod_worker(pod(annotations=annotated)), probe, Seen(), 0, False)  # type: ignore[arg-type]
    assert as_old.weights_version == "v2" and not as_old.routed  # loaded v2: Resume re-annotates
    current = {"loom.dev/weights-version": "v2"}
    routed = worker_state(pod_worker(pod(annotations=current)), probe, Seen(), 0, False)  # type: ignore[arg-type]
    assert routed.routed and routed.routable
    drained = {**current, "loom.dev/draining": "true"}
    draining = worker_state(pod_worker(pod(annotations=drained)), probe, Seen(), 0, False)  # type: ignore[arg-type]
    assert not draining.routed
    fresh = worker_state(pod_worker(pod()), probe, Seen(), 0, False)  # type: ignore[arg-type]
    assert not fresh.routed  # a new pod waits for the operator's RouteOn


def test_a_drain_waits_for_the_larger_of_the_routers_and_the_workers_count() -> None:
    w = pod_worker(pod())
    assert w is not None
    assert worker_state(w, Probe(True, status(in_flight=1)), Seen(), 3, False).in_flight == 3
    assert worker_state(w, Probe(True, status(in_flight=4)), Seen(), 3, False).in_flight == 4
    leases = Seen(kv_leases=2)
    assert worker_state(w, Probe(True, status()), leases, 0, False).busy == 2


def test_a_failed_probe_is_not_ready_and_keeps_what_was_seen() -> None:
    w = pod_worker(pod())
    assert w is not None
    seen = Seen(status=status("v1", in_flight=2), last_seen=5.0)
    state = worker_state(w, Probe(False, None, error="refused"), seen, 0, False)
    assert (state.ready, state.weights_version, state.in_flight, state.last_seen) == (
        False, "v1", 2, 5.0
    )  # fmt: skip


def test_route_patches() -> None:
    assert route_patch(None) == {"metadata": {"annotations": {"loom.dev/draining": "true"}}}
    on = route_patch("v3")["metadata"]["annotations"]
    assert on == {"loom.dev/draining": None, "loom.dev/weights-version": "v3"}


def record(endpoint_id: str, version: str = "v1", **kw: Any) -> EndpointRecord:
    spec = EndpointSpec("http://127.9.0.4:8000", "decode", version)
    return EndpointRecord(endpoint_id, spec, **kw)


def test_in_flight_is_summed_over_the_routers() -> None:
    a = {"w-0": record("w-0", in_flight=2), "w-1": record("w-1", in_flight=1)}
    b = {"w-0": record("w-0", in_flight=3)}
    assert in_flight_by_worker([a, b]) == {"w-0": 5, "w-1": 1}
    assert in_flight_by_worker([]) == {}


def test_a_worker_is_routed_as_a_version_only_when_every_router_routes_it_so() -> None:
    a = {"w-0": record("w-0"), "w-1": record("w-1"), "w-2": record("w-2", "v2")}
    b = {"w-0": record("w-0"), "w-1": record("w-1", draining=True), "w-2": record("w-2", "v1")}
    assert routed_as([a, b]) == {"w-0": "v1"}  # w-1 drained by one, w-2 seen as two versions
    assert routed_as([a, {"w-0": record("w-0")}]) == {"w-0": "v1"}  # w-1 unknown to the second
    assert routed_as([{"w-0": record("w-0", ready=False)}]) == {}
    assert routed_as([{"w-0": record("w-0", down=True, down_by_router=True)}]) == {"w-0": "v1"}
    assert routed_as([]) == {}


def test_a_worker_is_not_routed_until_the_routers_route_it() -> None:
    annotated = pod_worker(pod(annotations={"loom.dev/weights-version": "v1"}))
    assert annotated is not None
    probe = Probe(True, status("v1"))
    assert not worker_state(annotated, probe, Seen(), 0, False, router_routes=False).routed
    assert worker_state(annotated, probe, Seen(), 0, False, router_routes=True).routed


def test_unschedulable_counts_each_role_s_pods_no_node_has_room_for() -> None:
    def pending(role: str, reason: str) -> dict[str, Any]:
        return {"metadata": {"labels": {"loom.dev/role": role}},
                "status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": reason}]}}  # fmt: skip

    placed = {"metadata": {"labels": {"loom.dev/role": "decode"}},
              "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}  # fmt: skip
    router = pending("", "Unschedulable")
    router["metadata"]["labels"] = {"app.kubernetes.io/component": "router"}
    got = unschedulable([pending("decode", "Unschedulable"), pending("decode", "Unschedulable"),
                         pending("prefill", "SchedulingGated"), placed, router])  # fmt: skip
    assert got == {"decode": 2}


def test_a_push_is_rebuilt_from_a_live_peer_that_serves_its_version() -> None:
    pods = {}
    for i, ip in enumerate(("127.9.0.1", "127.9.0.2", "127.9.0.3")):
        w = pod_worker(pod(f"dep-decode-{i}", ip=ip))
        assert w is not None
        pods[w.name] = w
    load = LoadWeights("dep-decode-0", "push://u1", "p2")

    def peer(*versions: str | None, **kw: Any) -> str:
        states = tuple(make_worker("decode", i, v, **kw) for i, v in enumerate(versions))
        return rebuild_peer(load, FleetObservation(states, now=1.0), pods)

    assert peer("v1", "p2", "p2") == "127.9.0.2:50051"  # the first other worker serving p2
    assert peer("p2", "v1", "v1") == ""  # only the loading worker itself has it
    assert peer("v1", "v1", None) == ""  # nobody serves p2 yet (a barrier swap under way)
    assert peer("v1", "p2", "p2", ready=False) == ""  # no healthy one
