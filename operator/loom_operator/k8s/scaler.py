"""One DeploymentCard's scaling on Kubernetes, each fleet round: settle every role's count
between the card and its RoleScale (k8s/scale_rule.py), let Loom's planner move the roles it
names (control/autoscaler.py → fleet/autoscale.py), and, once the round's actions are done, set
each StatefulSet's replicas so that only stopped workers' pods are removed (k8s/pod_count.py) —
a role the card dropped included, whose StatefulSet, Service and RoleScale go once its last
worker is stopped.

Owns the writes of counts (card replicas, RoleScale spec and status, StatefulSet replicas), the
removal of a dropped role's objects, the scaling events, the `Autoscaling` condition and the
operator's scaling metrics; never chooses which worker retires (the fleet core does) and never
deletes a pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import ROLE_NAMES, RoleName
from loom_operator.control.autoscaler import Autoscaler
from loom_operator.fleet.actions import StopWorker
from loom_operator.fleet.autoscale import AutoscalePolicy
from loom_operator.fleet.desired import DesiredFleet, autoscale_policy
from loom_operator.fleet.observed import FleetObservation
from loom_operator.k8s.drift import Applied
from loom_operator.k8s.fleet import Events, PlannerView, PodFleet, Round
from loom_operator.k8s.kube import MERGE, Kube, KubeError, object_path
from loom_operator.k8s.labels import SCALE_MANAGER, role_object
from loom_operator.k8s.metrics import OperatorMetrics
from loom_operator.k8s.pod_count import role_pod_count
from loom_operator.k8s.render.role_scale import pod_selector
from loom_operator.k8s.scale_rule import ScaleView, Settled, settle
from loom_operator.k8s.scale_status import autoscaling_condition, owns_replicas, role_scale_status
from loom_runtime.wire.pods import ROLE_LABEL

logger = logging.getLogger(__name__)

Obj = dict[str, Any]


def take_replicas(kube: Kube, namespace: str, name: str, replicas: int) -> Obj:
    """Set a StatefulSet's replicas under the scaler's own field manager (so re-applying the
    rendered StatefulSet, which then omits them, never resets them)."""
    meta = {"name": name, "namespace": namespace}
    body = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
            "spec": {"replicas": replicas}}  # fmt: skip
    return kube.apply(body, SCALE_MANAGER)


def replicas_of(statefulset: Obj) -> int:
    return int((statefulset.get("spec") or {}).get("replicas") or 0)


ROLE_KINDS = ("StatefulSet", "Service", "RoleScale")
"""What a role renders (`<card>-<role>` each): what goes when the card drops the role."""


def dropped_roles(
    statefulsets: Mapping[str, Obj], counts: Mapping[RoleName, int]
) -> dict[RoleName, Obj]:
    """The card's StatefulSets of roles the card no longer has, by role."""
    out: dict[RoleName, Obj] = {}
    for sts in statefulsets.values():
        role = ((sts.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL)
        if role in ROLE_NAMES and role not in counts:
            out[role] = sts
    return out


class CardScaler:
    """The scaling of one card, round after round (one per card loop)."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        events: Events,
        metrics: OperatorMetrics | None,
        applied: Applied | None = None,
    ) -> None:
        self._kube, self.namespace, self.name = kube, namespace, name
        self._events, self._metrics = events, metrics
        self._applied = applied
        """What this process applied (its own writes of counts are no drift)."""
        self._autoscaler: Autoscaler | None = None
        self._scales: dict[RoleName, Obj] = {}
        self._taken: dict[RoleName, int] = {}
        """Role -> the RoleScale generation whose spec.replicas the operator took in."""
        self._card_writes: dict[RoleName, tuple[int, int]] = {}
        """Role -> (replicas, card generation) written into the card, until the watched card
        shows that generation (a count taken from a RoleScale must not be undone meanwhile)."""
        self._reasons: dict[RoleName, str] = {}
        self.condition: dict[str, Any] | None = None
        """The `Autoscaling` condition while the planner runs (None: it does not)."""

    async def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        return await asyncio.to_thread(partial(fn, *args, **kw))

    async def round(
        self,
        fleet: PodFleet,
        seen: tuple[FleetObservation, list[Obj]],
        scales: list[Obj],
        desired: DesiredFleet,
        deployment: DeploymentCard,
        generation: int,
        now: float,
    ) -> tuple[DesiredFleet, dict[RoleName, int], Round]:
        """One fleet round with its counts: with what `fleet.look` saw (`seen`) and the card's
        RoleScales (`scales`, from the watch cache), settle, plan, then the core decides on the
        fleet at those counts (the caller persists, executes, then calls `follow`)."""
        observed, pods = seen
        counts = await self.settle(deployment, generation, scales)
        view = fleet.planner_view()
        counts = await self.plan(desired.autoscale, counts, observed, view, now, generation)
        desired = desired.with_replicas(counts)
        return desired, counts, fleet.decide(desired, observed, pods)

    # -- settle -----------------------------------------------------------------------------

    async def settle(
        self, deployment: DeploymentCard, generation: int, scales: list[Obj]
    ) -> dict[RoleName, int]:
        """Every role's count, the card and each RoleScale (`scales`: the card's, as the watch
        cache holds them) made to agree (scale_rule.py)."""
        self._scales = {s["spec"]["role"]: s for s in scales}
        section = deployment.spec.autoscaling
        policy = None if section is None else autoscale_policy(section)
        counts: dict[RoleName, int] = {}
        for role, spec in deployment.spec.roles.present().items():
            card_n = spec.replicas
            written = self._card_writes.get(role)
            if written is not None and generation < written[1]:
                card_n = written[0]
            obj = self._scales.get(role)
            s = settle(role, card_n, self._view(role, obj), policy)
            if obj is not None:
                await self._write(s, obj)
            counts[role] = s.desired
            moved = s.card_replicas is not None or s.scale_replicas is not None or s.message
            if moved or role not in self._reasons:  # else the last decider's reason stands
                self._reasons[role] = s.reason
        return counts

    def _view(self, role: RoleName, obj: Obj | None) -> ScaleView:
        if obj is None:
            return ScaleView(None)
        seen = (obj.get("status") or {}).get("observedGeneration")
        mine = self._taken.get(role)
        taken = seen if mine is None else mine if seen is None else max(seen, mine)
        replicas = (obj.get("spec") or {}).get("replicas")
        return ScaleView(replicas, int(obj["metadata"].get("generation") or 0), taken)

    async def _write(self, s: Settled, obj: Obj) -> None:
        generation = int(obj["metadata"].get("generation") or 0)
        if s.card_replicas is not None:
            path = object_path("DeploymentCard", self.namespace, self.name)
            patch = {"spec": {"roles": {s.role: {"replicas": s.card_replicas}}}}
            card = await self._call(self._kube.patch, path, patch, MERGE)
            self._card_writes[s.role] = (s.card_replicas, int(card["metadata"]["generation"]))
            self._taken[s.role] = generation
        elif s.scale_replicas is not None:
            self._taken[s.role] = await self._scale_to(s.role, s.scale_replicas)
        else:
            self._taken[s.role] = max(generation, self._taken.get(s.role, 0))
        if s.message:
            self._events("Scale", s.message, "Warning" if s.reason == "Clamped" else "Normal")

    async def _scale_to(self, role: RoleName, replicas: int) -> int:
        """Write a RoleScale's spec.replicas; the generation that write made."""
        path = object_path("RoleScale", self.namespace, role_object(self.name, role))
        done = await self._call(self._kube.patch, path, {"spec": {"replicas": replicas}}, MERGE)
        self._scales[role] = done
        if self._applied is not None:
            self._applied.wrote(self.namespace, "RoleScale", role_object(self.name, role), done)
        return int(done["metadata"].get("generation") or 0)

    # -- plan -------------------------------------------------------------------------------

    async def plan(
        self,
        policy: AutoscalePolicy | None,
        counts: dict[RoleName, int],
        observed: FleetObservation,
        view: PlannerView,
        now: float,
        generation: int,
    ) -> dict[RoleName, int]:
        """The counts after Loom's planner, when it runs and is due (every 5 s); each change is
        written into the role's RoleScale, said as an event and counted in the metrics."""
        if policy is None or not policy.planner:
            await self.close()
            self.condition = None
            return counts
        if self._autoscaler is None or self._autoscaler.policy != policy:
            await self.close()
            self._autoscaler = Autoscaler(policy)
        if not self._autoscaler.due(now):
            return counts
        plan = await self._autoscaler.decide(
            counts, view.urls, observed, view.statuses, view.held, now, view.unschedulable
        )
        out = dict(counts)
        for d in plan.decisions:
            if self._metrics is not None:
                self._metrics.decision(self.namespace, self.name, d)
            if not d.changed:
                continue
            if d.role in self._scales:
                self._taken[d.role] = await self._scale_to(d.role, d.desired)
            verb = "scaling up" if d.desired > d.current else "scaling down"
            self._events(
                "Autoscale", f"{verb} {d.role} {d.current} → {d.desired} ({d.reason}: {d.message})",
                "Normal",
            )  # fmt: skip
            out[d.role] = d.desired
            self._reasons[d.role] = d.reason
        self.condition = autoscaling_condition(plan, generation)
        return out

    # -- follow -----------------------------------------------------------------------------

    async def follow(
        self, counts: Mapping[RoleName, int], r: Round, statefulsets: Mapping[str, Obj]
    ) -> None:
        """Each StatefulSet keeps its desired pods plus the retiring workers not stopped yet
        (pod_count.py); each RoleScale's status says what serves."""
        stopped = {a.worker for a in r.reconciliation.actions if isinstance(a, StopWorker)}
        for role, n in counts.items():
            sts = statefulsets.get(role_object(self.name, role))
            if sts is not None:
                target = role_pod_count(self.name, role, n, r.observed.workers, stopped)
                await self._keep_pods(role, sts, target)
            if self._metrics is not None:
                self._metrics.desired(self.namespace, self.name, role, n)
            serving = sum(1 for w in r.observed.workers if w.role == role and w.routable)
            await self._status(role, serving, n)
        for role, sts in dropped_roles(statefulsets, counts).items():
            await self._retire_role(role, sts, r, stopped)

    async def _retire_role(self, role: RoleName, sts: Obj, r: Round, stopped: set[str]) -> None:
        """A role the card dropped: its StatefulSet keeps the workers the core has not stopped
        yet (they are drained first, as any retiring worker); once it keeps none and none is
        left, its StatefulSet, Service and RoleScale are deleted."""
        target = role_pod_count(self.name, role, 0, r.observed.workers, stopped)
        await self._keep_pods(role, sts, target)
        if target > 0 or replicas_of(sts) > 0 or any(w.role == role for w in r.observed.workers):
            return
        name = role_object(self.name, role)
        for kind in ROLE_KINDS:
            try:
                await self._call(self._kube.delete, object_path(kind, self.namespace, name))
            except KubeError as exc:
                if exc.status != 404:
                    raise
        if self._metrics is not None:
            self._metrics.forget(self.namespace, self.name, (role,))
        self._events("RoleRemoved", f"{role} is no longer in the card: its workers drained and "
                     f"stopped, {name}'s {', '.join(ROLE_KINDS)} deleted", "Normal")  # fmt: skip

    async def _keep_pods(self, role: RoleName, sts: Obj, target: int) -> None:
        before = replicas_of(sts)
        if target == before and owns_replicas(sts, SCALE_MANAGER):
            return
        name = role_object(self.name, role)
        done = await self._call(take_replicas, self._kube, self.namespace, name, target)
        if self._applied is not None:
            self._applied.wrote(self.namespace, "StatefulSet", name, done)
        if target != before:
            logger.info("%s/%s: StatefulSet %s %d → %d pods", self.namespace, self.name, name,
                        before, target)  # fmt: skip

    async def _status(self, role: RoleName, serving: int, desired: int) -> None:
        obj = self._scales.get(role)
        if obj is None:
            return
        status = role_scale_status(serving, desired, pod_selector(self.name, role),
                                   self._taken.get(role), self._reasons.get(role, ""))  # fmt: skip
        if all((obj.get("status") or {}).get(k) == v for k, v in status.items()):
            return
        path = object_path("RoleScale", self.namespace, role_object(self.name, role), "status")
        await self._call(self._kube.patch, path, {"status": status}, MERGE)

    @property
    def planner_at(self) -> float | None:
        """When the planner decides next (None: it does not run)."""
        return None if self._autoscaler is None else self._autoscaler.next_at

    async def close(self) -> None:
        if self._autoscaler is not None:
            await self._autoscaler.close()
            self._autoscaler = None
