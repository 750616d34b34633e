"""Worker pods as the fleet controller sees them, and the annotations that route them.

Pure, over the pod dicts the API server returns: a pod's facts (`pod_worker`), those facts with
this round's probe as a `WorkerState` (`worker_state`), and the merge patches that put a worker
into or out of routing (`route_patch`). Never calls anything.

A worker is routed only while its pod carries `loom.dev/weights-version` equal to the version
it reports and no `loom.dev/draining: "true"`: the operator sets both, after the worker proved
healthy (and after each weight load), so a new pod is routable only once the operator says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from loom_operator.api.roles import ROLE_NAMES, RoleName
from loom_operator.control.probe import Probe, Seen, is_loading, latest_status, probed_ready
from loom_operator.fleet.actions import LoadWeights
from loom_operator.fleet.observed import FleetObservation, WorkerState
from loom_runtime.wire.pods import (
    CONTROL_PORT,
    DRAINING_ANNOTATION,
    HTTP_PORT,
    ROLE_LABEL,
    WEIGHTS_VERSION_ANNOTATION,
    named_ports,
)
from loom_runtime.wire.router_admin import EndpointRecord

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class PodWorker:
    """What a worker pod's object says (nothing probed yet)."""

    name: str
    role: RoleName
    uid: str
    ip: str | None
    http_port: int
    control_port: int
    alive: bool
    """The pod exists, is not Terminating and its container runs or is starting."""
    terminating: bool
    """Deleted, stopping gracefully: the router sends it nothing new and its runtime finishes
    what it has before it exits; the StatefulSet brings a new pod of that name."""
    draining: bool
    """Annotated `loom.dev/draining: "true"`."""
    routed_version: str | None
    """Its `loom.dev/weights-version` annotation: the version the router routes it as."""
    restarts: int = 0
    started_at: float | None = None
    last_exit_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.http_port}"

    @property
    def control(self) -> str:
        return f"{self.ip}:{self.control_port}"

    @property
    def incarnation(self) -> tuple[str, int]:
        """Changes when the pod is replaced or its container restarts."""
        return self.uid, self.restarts


def _time(stamp: object) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def pod_worker(pod: Obj) -> PodWorker | None:
    """The worker `pod` runs, or None when it is not a worker pod with both named ports."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    role = (meta.get("labels") or {}).get(ROLE_LABEL)
    ports = named_ports(spec)
    if role not in ROLE_NAMES or HTTP_PORT not in ports or CONTROL_PORT not in ports:
        return None
    container: Obj = next(iter(status.get("containerStatuses") or []), {})
    state = container.get("state") or {}
    waiting = (state.get("waiting") or {}).get("reason")
    exited = "terminated" in state or waiting in ("CrashLoopBackOff", "Error")
    alive = (
        not meta.get("deletionTimestamp")
        and status.get("phase", "Pending") in ("Pending", "Running")
        and not exited
    )
    notes = meta.get("annotations") or {}
    last = ((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
    return PodWorker(
        name=str(meta["name"]),
        role=cast(RoleName, role),
        uid=str(meta.get("uid", "")),
        ip=status.get("podIP") or None,
        http_port=ports[HTTP_PORT],
        control_port=ports[CONTROL_PORT],
        alive=bool(alive),
        terminating=bool(meta.get("deletionTimestamp")),
        draining=notes.get(DRAINING_ANNOTATION) == "true",
        routed_version=notes.get(WEIGHTS_VERSION_ANNOTATION) or None,
        restarts=int(container.get("restartCount") or 0),
        started_at=_time((state.get("running") or {}).get("startedAt")),
        last_exit_at=_time(last),
    )


def worker_state(
    pod: PodWorker,
    probe: Probe | None,
    seen: Seen,
    router_in_flight: int,
    loading: bool,
    router_routes: bool = True,
) -> WorkerState:
    """The WorkerState of `pod` from this round's probe, what was seen before, and what the
    routers say: the requests they still count for it (a drain waits for the larger of theirs
    and its own) and whether every router that answered routes it as its annotated version
    (`router_routes`): a worker counts as routed, so as available, only once they do."""
    status = latest_status(probe, seen)
    version = None if status is None else status.weights_version
    return WorkerState(
        name=pod.name,
        role=pod.role,
        weights_version=version,
        address=None if pod.ip is None else f"{pod.ip}:{pod.http_port}",
        alive=pod.alive,
        ready=probed_ready(pod.alive, probe),
        in_flight=max(router_in_flight, 0 if status is None else status.in_flight),
        pending_kv_pulls=seen.kv_leases,
        admission_open=True if status is None else status.admission_open,
        routed=(
            router_routes
            and not pod.draining
            and version is not None
            and pod.routed_version == version
        ),
        loading=is_loading(loading, status),
        restarts=pod.restarts,
        started_at=pod.started_at,
        last_exit_at=pod.last_exit_at,
        last_seen=seen.last_seen,
    )


def in_flight_by_worker(answers: Sequence[Mapping[str, EndpointRecord]]) -> dict[str, int]:
    """Requests in flight per worker, summed over the routers' GET /admin/endpoints answers."""
    out: dict[str, int] = {}
    for records in answers:
        for endpoint_id, record in records.items():
            out[endpoint_id] = out.get(endpoint_id, 0) + record.in_flight
    return out


def routed_as(answers: Sequence[Mapping[str, EndpointRecord]]) -> dict[str, str]:
    """Worker -> the weights version *every* router routes it as (ready, not draining, not taken
    down); a worker some router does not route, or that routers see as different versions, is
    absent."""
    out: dict[str, str] = {}
    if not answers:
        return out
    for endpoint_id in set.intersection(*(set(records) for records in answers)):
        versions = {
            r.spec.weights_version if r.routed and r.ready else None
            for r in (records[endpoint_id] for records in answers)
        }
        (version,) = versions if len(versions) == 1 else (None,)
        if version:
            out[endpoint_id] = version
    return out


def route_patch(version: str | None) -> dict[str, Any]:
    """The merge patch that routes a worker as `version`, or (None) takes it out of routing."""
    if version is None:
        return {"metadata": {"annotations": {DRAINING_ANNOTATION: "true"}}}
    notes = {DRAINING_ANNOTATION: None, WEIGHTS_VERSION_ANNOTATION: version}
    return {"metadata": {"annotations": notes}}


def unschedulable(pods: Sequence[Obj]) -> dict[RoleName, int]:
    """Per role, worker pods the scheduler could not place (PodScheduled False, reason
    Unschedulable): the planner does not grow a role no node has room for."""
    out: dict[RoleName, int] = {}
    for pod in pods:
        role = ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL)
        conditions = (pod.get("status") or {}).get("conditions") or []
        stuck = any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
            for c in conditions
        )  # fmt: skip
        if stuck and role in ROLE_NAMES:
            key = cast(RoleName, role)
            out[key] = out.get(key, 0) + 1
    return out


def rebuild_peer(a: LoadWeights, observed: FleetObservation, pods: Mapping[str, PodWorker]) -> str:
    """Where a worker loading a push (`a`: source push://…) receives it from if it has not staged
    it (it started after the push): the control address of another live worker that serves the
    push's version, the first by name ("" when none does yet — the load then needs the push
    staged, and a later round asks again once a peer serves it). Pure."""
    for state in sorted(observed.workers, key=lambda w: w.name):
        pod = pods.get(state.name)
        if (
            state.name != a.worker and state.weights_version == a.version and state.healthy
            and pod is not None and pod.alive and pod.ip is not None
        ):  # fmt: skip
            return pod.control
    return ""
