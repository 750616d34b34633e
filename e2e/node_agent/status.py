"""A pod's status as the kubelet reports it, rendered from what its containers are doing.

Owns the pure mapping container runs → phase, conditions and containerStatuses; never
talks to the API (the pod runner patches what this returns when it changes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

State = Literal["waiting", "running", "terminated"]


def timestamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True)
class Terminated:
    exit_code: int
    reason: str
    started_at: float
    finished_at: float


@dataclass(frozen=True)
class ContainerView:
    """What one container is doing now, as the pod runner saw it."""

    name: str
    image: str
    state: State
    reason: str = ""
    message: str = ""
    pid: int = 0
    started_at: float = 0.0
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    terminated: Terminated | None = None  # this run, when state == "terminated"
    last: Terminated | None = None  # the previous run, if any


def _state(v: ContainerView) -> dict[str, Any]:
    if v.state == "running":
        return {"running": {"startedAt": timestamp(v.started_at)}}
    if v.state == "terminated" and v.terminated is not None:
        return {"terminated": _terminated(v.terminated)}
    waiting: dict[str, Any] = {"reason": v.reason or "ContainerCreating"}
    if v.message:
        waiting["message"] = v.message
    return {"waiting": waiting}


def _terminated(t: Terminated) -> dict[str, Any]:
    return {
        "exitCode": t.exit_code,
        "reason": t.reason,
        "startedAt": timestamp(t.started_at),
        "finishedAt": timestamp(t.finished_at),
    }


def container_status(v: ContainerView) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": v.name,
        "image": v.image,
        "imageID": "",
        "ready": v.ready,
        "started": v.started,
        "restartCount": v.restart_count,
        "state": _state(v),
        "lastState": {"terminated": _terminated(v.last)} if v.last else {},
    }
    if v.pid:
        out["containerID"] = f"loom-e2e://{v.pid}"
    return out


def phase(views: list[ContainerView], restart_policy: str) -> str:
    if any(v.restart_count == 0 and v.state == "waiting" for v in views):
        return "Pending"
    if all(v.state == "terminated" for v in views):
        codes = [v.terminated.exit_code if v.terminated else 1 for v in views]
        if restart_policy == "Never" or (restart_policy == "OnFailure" and not any(codes)):
            return "Succeeded" if not any(codes) else "Failed"
    return "Running"


def _condition(kind: str, ok: bool, now: str, reason: str = "") -> dict[str, Any]:
    cond = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now}
    if not ok and reason:
        cond["reason"] = reason
    return cond


def pod_status(
    views: list[ContainerView],
    restart_policy: str,
    pod_ip: str,
    start_time: float,
    scheduled: dict[str, Any] | None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The status object to patch. Condition transition times carry over while unchanged."""
    now = timestamp(time.time())
    ready = bool(views) and all(v.ready for v in views)
    reason = "" if ready else "ContainersNotReady"
    conditions = [
        _condition("PodReadyToStartContainers", True, now),
        _condition("Initialized", True, now),
        _condition("ContainersReady", ready, now, reason),
        _condition("Ready", ready, now, reason),
    ]
    old = {c["type"]: c for c in (previous or {}).get("conditions") or []}
    for cond in conditions:
        before = old.get(cond["type"])
        if before is not None and before.get("status") == cond["status"]:
            cond["lastTransitionTime"] = before.get("lastTransitionTime", now)
    if scheduled is not None:
        conditions.insert(0, scheduled)
    return {
        "phase": phase(views, restart_policy),
        "conditions": conditions,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": timestamp(start_time),
        "containerStatuses": [container_status(v) for v in views],
    }


def restart_backoff(restarts: int, base_s: float, cap_s: float = 300.0) -> float:
    """The kubelet's crash back-off: base, 2·base, 4·base, … capped (10 s → 5 min by default)."""
    return float(min(cap_s, base_s * (2 ** max(restarts - 1, 0))))
