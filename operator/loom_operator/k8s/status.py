"""A DeploymentCard's status from what runs: per-role readiness, phase and conditions.

Pure, over the StatefulSets, Deployments and pods the operator listed and the fleet controller's
conditions and record; never writes (the handler patches what this returns) and never counts a
pod of an old revision, or a worker not yet on the target version, as ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import RoleName
from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.conditions import ALL_READY
from loom_operator.fleet.record import FleetRecord
from loom_operator.k8s.labels import role_object, router_object
from loom_runtime.wire.pods import (
    COMPONENT_LABEL,
    HTTP_PORT,
    ROLE_LABEL,
    ROUTER_PORTS,
    WEIGHTS_VERSION_ANNOTATION,
)

Obj = Mapping[str, Any]
REVISION = "controller-revision-hash"


def pod_ready(pod: Obj) -> bool:
    """Ready and not Terminating."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and not (pod.get("metadata") or {}).get("deletionTimestamp")


def _crash_looping(pods: Sequence[Obj]) -> list[str]:
    out = []
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
                out.append(f"{pod['metadata']['name']} ({cs.get('restartCount', 0)} restarts)")
    return out


def role_status(sts: Obj | None, pods: Sequence[Obj], desired: int) -> dict[str, Any]:
    """Ready = Ready pods of the StatefulSet's update revision (an old pod never counts)."""
    revision = ((sts or {}).get("status") or {}).get("updateRevision")
    current = [
        p for p in pods if revision and p["metadata"].get("labels", {}).get(REVISION) == revision
    ]
    ready = [p for p in current if pod_ready(p)]
    versions = {
        (p["metadata"].get("annotations") or {}).get(WEIGHTS_VERSION_ANNOTATION) for p in ready
    }
    out: dict[str, Any] = {"ready": len(ready), "desired": desired}
    if versions:
        out["weightsVersion"] = versions.pop() if len(versions) == 1 else "mixed"
    return out


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason,
            "message": message, "observedGeneration": generation}  # fmt: skip


def with_transition_times(
    conditions: list[dict[str, Any]], previous: Sequence[Obj], now: datetime | None = None
) -> list[dict[str, Any]]:
    """Each condition keeps its lastTransitionTime while its status is unchanged."""
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = {c.get("type"): c for c in previous}
    for cond in conditions:
        before = old.get(cond["type"])
        same = before is not None and before.get("status") == cond["status"]
        cond["lastTransitionTime"] = (
            before.get("lastTransitionTime", stamp) if same and before else stamp
        )
    return conditions


def deployment_status(
    card: DeploymentCard,
    generation: int,
    statefulsets: Mapping[str, Obj],
    pods: Sequence[Obj],
    desired: Mapping[RoleName, int] | None = None,
) -> dict[str, Any]:
    """phase, conditions (without transition times), roles, readyRoles, replicas,
    weightsVersion, endpoint and observedGeneration. `desired`: each role's count as the scale
    rule settled it (default: the card's replicas)."""
    name = card.name
    roles: dict[str, Any] = {}
    for role, spec in card.spec.roles.present().items():
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(ROLE_LABEL) == role]
        wanted = spec.replicas if desired is None else desired.get(role, spec.replicas)
        roles[role] = role_status(statefulsets.get(role_object(name, role)), mine, wanted)
    routers = [
        p for p in pods if (p["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == "router"
    ]
    routers_ready = sum(1 for p in routers if pod_ready(p))
    router_wanted = card.spec.router.replicas
    full = [r for r, s in roles.items() if s["ready"] >= s["desired"]]
    serving = len(full) == len(roles) and routers_ready >= router_wanted
    versions = {s.get("weightsVersion") for s in roles.values() if s.get("weightsVersion")}
    crashing = _crash_looping(pods)
    waiting = [
        f"{r} {s['ready']}/{s['desired']}" for r, s in roles.items() if s["ready"] < s["desired"]
    ]
    if routers_ready < router_wanted:
        waiting.append(f"router {routers_ready}/{router_wanted}")
    conditions = [
        _condition("Valid", True, "CardsValid", "the cards are valid together", generation),
        _condition("Ready", serving, "AllReplicasReady" if serving else "ReplicasNotReady",
                   "every role and the router are ready on the current revision" if serving
                   else "waiting for " + ", ".join(waiting), generation),
        _condition("Progressing", not serving, "RollingOut" if not serving else "Stable",
                   "replicas are starting or rolling to the current revision" if not serving
                   else "nothing to roll out", generation),
        _condition("Degraded", bool(crashing), "CrashLoop" if crashing else "Healthy",
                   ("crash-looping: " + ", ".join(crashing)) if crashing
                   else "no pod is crash-looping",
                   generation),
    ]  # fmt: skip
    phase = "Degraded" if crashing else "Ready" if serving else "Progressing"
    http, namespace = ROUTER_PORTS[HTTP_PORT], card.metadata.namespace or "default"
    out = {
        "phase": phase,
        "conditions": conditions,
        "observedGeneration": generation,
        "roles": roles,
        "readyRoles": f"{len(full)}/{len(roles)}",
        "replicas": ", ".join(f"{r} {s['ready']}/{s['desired']}" for r, s in roles.items()),
        "weightsVersion": versions.pop() if len(versions) == 1 else ("mixed" if versions else None),
        "endpoint": f"http://{router_object(name)}.{namespace}.svc:{http}/v1",
    }
    return {k: v for k, v in out.items() if v is not None}


WORKER_STEPS = {"pending": "Waiting", "frozen": "Draining", "drained": "Transferring",
                "loaded": "Resuming", "resumed": "Done", "failed": "Failed"}  # fmt: skip
"""The fleet record's sync steps as the CRD's weightSync.workers steps."""


def _fleet_condition(c: SetCondition, generation: int) -> dict[str, Any]:
    return _condition(c.type, c.status == "True", c.reason, c.message, generation)


def _weight_sync(record: FleetRecord, component: str, message: str) -> dict[str, Any] | None:
    sync = record.sync
    if sync is None:
        return None
    steps = {w.name: WORKER_STEPS[w.step] for w in sync.workers}
    failed = any(w.step == "failed" for w in sync.workers)
    phase = "Failed" if failed else "Done" if sync.finished_at is not None else "Syncing"
    started = datetime.fromtimestamp(sync.started_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"phase": phase, "targetVersions": {component: sync.target_version},
            "workers": steps, "updated": sum(1 for s in steps.values() if s == "Done"),
            "total": len(steps), "startedAt": started, "message": message}  # fmt: skip


CAPACITY_LOST = "CapacityLost"
ROUTING = "Routing"


def capacity_lost(previous: Mapping[str, Any], fresh: Mapping[str, Any], generation: int) -> str:
    """Why capacity a card had is missing now ("" when it is not): a role that was full under
    this same generation (no spec change since) has fewer ready pods — a pod was deleted or
    crashed, and its StatefulSet is bringing it back. It stays so until the role is full again."""
    before = previous.get("roles") or {}
    conditions: list[Obj] = list(previous.get("conditions") or [])
    was_lost = any(
        c.get("type") == "Degraded" and c.get("reason") == CAPACITY_LOST
        and c.get("status") == "True"
        for c in conditions
    )  # fmt: skip
    same_spec = previous.get("observedGeneration") == generation
    short = []
    for role, now in (fresh.get("roles") or {}).items():
        then = before.get(role) or {}
        was_full = then.get("desired") == now["desired"] and then.get("ready", 0) >= now["desired"]
        if now["ready"] < now["desired"] and same_spec and (was_full or was_lost):
            short.append(f"{role} {now['ready']}/{now['desired']}")
    if not short:
        return ""
    return f"lost capacity: {', '.join(short)} ready; the StatefulSet is replacing the pod"


def with_fleet(
    base: Mapping[str, Any],
    fleet: tuple[SetCondition, ...],
    record: FleetRecord,
    component: str,
    version: str,
    generation: int,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`base` (deployment_status) joined with the fleet controller's view: Ready only when every
    pod runs the current revision *and* every worker serves the target version routably (a
    fleet still serving mid-sync is Ready=False with the core's reason); Degraded by a crash
    loop, a failed worker, or capacity lost since the last status (`previous`: a deleted pod
    until its replacement is ready); WeightSyncing, weightSync and the record itself
    (fleetRecord) from the core."""
    out = dict(base)
    # A sync closes admission, which fails the readiness probe: not a loss of capacity.
    in_sync = any(c.type == "WeightSyncing" and c.status == "True" for c in fleet)
    lost = "" if in_sync else capacity_lost(previous or {}, base, generation)
    k8s = {c["type"]: c for c in base["conditions"]}
    core = {c.type: c for c in fleet}
    # The core's conditions are as they will be once its actions are done; Ready waits until the
    # pods say so too: every ready pod annotated (routed) as the target version.
    routed = all(r.get("weightsVersion") == version for r in (base.get("roles") or {}).values())
    ready = k8s["Ready"]["status"] == "True" and core["Ready"].reason == ALL_READY
    source = core["Ready"] if k8s["Ready"]["status"] == "True" else None
    conditions = [k8s["Valid"]]
    if ready and not routed:
        message = f"routing every worker as {version}"
        conditions.append(_condition("Ready", False, ROUTING, message, generation))
    elif ready:
        conditions.append(_fleet_condition(core["Ready"], generation))
    elif source is not None:
        conditions.append(_condition("Ready", False, source.reason, source.message, generation))
    else:
        conditions.append(k8s["Ready"])
    progressing = core["Progressing"]
    if progressing.status == "True" or k8s["Progressing"]["status"] != "True":
        conditions.append(_fleet_condition(progressing, generation))
    else:
        conditions.append(k8s["Progressing"])
    degraded = k8s["Degraded"]
    if degraded["status"] != "True" and core["Degraded"].status != "True" and lost:
        degraded = _condition("Degraded", True, CAPACITY_LOST, lost, generation)
    conditions.append(
        degraded if degraded["status"] == "True" else _fleet_condition(core["Degraded"], generation)
    )
    syncing = core["WeightSyncing"]
    conditions.append(_fleet_condition(syncing, generation))
    status = {c["type"]: c["status"] == "True" for c in conditions}
    out["conditions"] = conditions
    out["phase"] = (
        "Degraded" if status["Degraded"] else "WeightSyncing" if status["WeightSyncing"]
        else "Ready" if status["Ready"] else "Progressing"
    )  # fmt: skip
    weight_sync = _weight_sync(record, component, syncing.message)
    if weight_sync is not None:
        out["weightSync"] = weight_sync
    out["fleetRecord"] = record.to_json()
    return out
