"""How many pods a role's StatefulSet keeps: the role's desired count, plus every retiring
worker above it that the fleet core has not stopped yet.

A StatefulSet removes its highest ordinals first and kills what it removes; the fleet core
(fleet/scaling.py) freezes, drains and only then stops the extra workers. So the StatefulSet's
replicas follow a scale-down only once the workers it would remove are stopped: the
controller-manager then deletes an idle pod, never a busy one. Pure; never chooses which worker
retires (the scaling plan does).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from loom_operator.api.roles import RoleName
from loom_operator.fleet.observed import WorkerState


def worker_index(name: str, deployment: str, role: RoleName) -> int | None:
    """The ordinal of `<deployment>-<role>-<i>` (None: not a worker of that role)."""
    prefix = f"{deployment}-{role}-"
    tail = name.removeprefix(prefix)
    return int(tail) if name.startswith(prefix) and tail.isdigit() else None


def statefulset_replicas(desired: int, present: Iterable[int], stopped: Iterable[int]) -> int:
    """Pods the StatefulSet keeps: `desired`, raised to cover each worker present (its ordinal)
    that is beyond it and not `stopped` — still serving, draining, or kept until the desired
    workers serve without it. Pure."""
    done = set(stopped)
    keep = [i + 1 for i in present if i >= desired and i not in done]
    return max([desired, *keep])


def role_pod_count(
    deployment: str,
    role: RoleName,
    desired: int,
    workers: Iterable[WorkerState],
    stopped: Collection[str],
) -> int:
    """`statefulset_replicas` of one role from the round's observed workers and the workers
    its StopWorker actions name. Pure."""
    present, gone = [], []
    for w in workers:
        i = worker_index(w.name, deployment, role) if w.role == role else None
        if i is not None:
            present.append(i)
            if w.name in stopped:
                gone.append(i)
    return statefulset_replicas(desired, present, gone)
