"""Worker pods as router endpoints: what a pod's labels, annotations and status say.

Pure, over the pod objects the API server returns (plain dicts); never watches anything
(shell/pod_watch.py does). The names are the operator's contract, `loom_runtime.wire.pods`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from loom_router.core.endpoints import Endpoint, EndpointSnapshot
from loom_runtime.wire.pods import (
    DRAINING_ANNOTATION,
    HTTP_PORT,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    ROLE_LABEL,
    WEIGHTS_VERSION_ANNOTATION,
    named_ports,
)
from loom_runtime.wire.router_admin import ROLES


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def endpoint_from_pod(pod: Mapping[str, Any]) -> Endpoint | None:
    """The endpoint a worker pod offers, or None (not a worker, no IP yet, finished).

    Ready is the pod's Ready condition; a Terminating pod (deletionTimestamp), one annotated
    `loom.dev/draining: "true"`, or one the operator has not yet given a
    `loom.dev/weights-version` (it has not proved healthy on a known version) is draining: it
    finishes what it has and gets nothing new.
    """
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    role = (meta.get("labels") or {}).get(ROLE_LABEL)
    ip = status.get("podIP")
    ports = named_ports(spec)
    if role not in ROLES or not ip or HTTP_PORT not in ports:
        return None
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    notes = meta.get("annotations") or {}
    version = str(notes.get(WEIGHTS_VERSION_ANNOTATION) or "")
    draining = (
        notes.get(DRAINING_ANNOTATION) == "true"
        or bool(meta.get("deletionTimestamp"))
        or not version
    )
    events = f"tcp://{ip}:{ports[KV_EVENTS_PORT]}" if KV_EVENTS_PORT in ports else None
    replay = f"tcp://{ip}:{ports[KV_REPLAY_PORT]}" if KV_REPLAY_PORT in ports else None
    return Endpoint(
        id=str(meta["name"]),
        url=f"http://{ip}:{ports[HTTP_PORT]}",
        role=role,
        weights_version=version,
        ready=pod_ready(pod),
        draining=draining,
        kv_events=events,
        kv_replay=replay,
    )


def reconcile_endpoints(
    current: EndpointSnapshot, pods: Iterable[Mapping[str, Any]]
) -> tuple[list[Endpoint], list[Endpoint], list[str]]:
    """(add, update, remove) that make `current` match the pods.

    A router-side `down` mark (a refused connection) is kept while the pod stays the same
    (same URL); a new pod at a new address starts up.
    """
    wanted = {e.id: e for e in (endpoint_from_pod(p) for p in pods) if e is not None}
    add, update = [], []
    for endpoint_id, endpoint in wanted.items():
        old = current.get(endpoint_id)
        if old is None:
            add.append(endpoint)
            continue
        merged = replace(endpoint, down=old.down and old.url == endpoint.url)
        if merged != old:
            update.append(merged)
    remove = [e.id for e in current.endpoints if e.id not in wanted]
    return add, update, remove
