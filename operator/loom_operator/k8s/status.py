"""A DeploymentCard's status from what runs: per-role readiness, phase and conditions.

Pure, over the StatefulSets, Deployments and pods the operator listed; never writes (the
handler patches what this returns) and never counts a pod of an old revision as ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
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


def _ready(pod: Obj) -> bool:
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
    ready = [p for p in current if _ready(p)]
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
) -> dict[str, Any]:
    """phase, conditions (without transition times), roles, readyRoles, weightsVersion,
    endpoint and observedGeneration."""
    name = card.name
    roles: dict[str, Any] = {}
    for role, spec in card.spec.roles.present().items():
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(ROLE_LABEL) == role]
        roles[role] = role_status(statefulsets.get(role_object(name, role)), mine, spec.replicas)
    routers = [
        p for p in pods if (p["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == "router"
    ]
    routers_ready = sum(1 for p in routers if _ready(p))
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
        "weightsVersion": versions.pop() if len(versions) == 1 else ("mixed" if versions else None),
        "endpoint": f"http://{router_object(name)}.{namespace}.svc:{http}/v1",
    }
    return {k: v for k, v in out.items() if v is not None}
