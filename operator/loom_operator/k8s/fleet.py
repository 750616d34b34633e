"""One DeploymentCard's fleet on Kubernetes, driven by the fleet controller core.

A round: take the card's pods from the watch cache, probe every worker pod (gRPC Status,
/health, a prefill pod's KV leases) and ask every router pod what it has in flight →
`fleet.reconcile` → the caller persists the record in the card's status → `execute` carries
out the actions:

- RouteOff / Freeze: annotate the pod `loom.dev/draining: "true"` (the router sends it nothing
  new); Freeze then closes the runtime's admission (Pause WAIT) once every router reports
  nothing in flight to it, so no request already on its way is refused.
- MigrateRequests: every router replays the worker's in-flight requests elsewhere; `abort` then
  aborts them on the worker.
- LoadWeights: a gRPC call in a task (it may take minutes); the pod is routed again as the new
  version only by the Resume that follows.
- Resume / RouteOn: reopen admission, then annotate the pod with the version it reports and drop
  `draining`: the router routes it from then on, paired only with workers of that version.
- StartWorker / StopWorker: the StatefulSet creates and removes pods; nothing to do here. The
  scaler (scaler.py) sets its replicas after the round: a stopped (drained) worker's pod is
  removed only once no higher one still serves (pod_count.py). A Terminating pod is not observed
  at all: it drains itself and its replacement takes its slot.
- RestartWorker: a pod that is alive but failed (no passing probe for the health timeout, or
  not ready within the startup timeout) is deleted, the Event saying which (the StatefulSet
  brings it back); a crashed container is restarted by its kubelet.

Owns these meanings and each action's idempotence; never chooses an action (the core does) and
never writes the card's status (card_loop.py does, from what `round` returns).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from loom_operator.api.roles import RoleName
from loom_operator.control.client import ControlClient, ControlError
from loom_operator.control.probe import Observer
from loom_operator.control.router_admin import RouterAdmin, RouterAdminError
from loom_operator.fleet.actions import (
    Action,
    Freeze,
    LoadWeights,
    MigrateRequests,
    RestartWorker,
    Resume,
    RouteOff,
    RouteOn,
    SetCondition,
    StartWorker,
    StopWorker,
)
from loom_operator.fleet.controller import Reconciliation, reconcile
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.record import FleetRecord
from loom_operator.k8s.kube import Kube, KubeError, object_path
from loom_operator.k8s.labels import control_secret
from loom_operator.k8s.pods import (
    PodWorker,
    in_flight_by_worker,
    pod_worker,
    rebuild_peer,
    route_patch,
    routed_as,
    unschedulable,
    worker_state,
)
from loom_operator.k8s.status import pod_ready
from loom_runtime.control_api.status import WorkerStatus
from loom_runtime.wire.pods import (
    COMPONENT_LABEL,
    HTTP_PORT,
    ROUTER_ADMIN_PORT,
    ROUTER_PORTS,
)
from loom_runtime.wire.push import PUSH_SCHEME

logger = logging.getLogger(__name__)

FREEZE_WAIT_S = 0.01  # Pause(WAIT) returns at once: admission closes, the drain is observed
CALL_TIMEOUT_S = 5.0

Obj = dict[str, Any]
Events = Callable[[str, str, str], None]
"""(reason, message, type "Normal" | "Warning"): an event on the DeploymentCard."""


@dataclass(frozen=True)
class Round:
    """What one round saw and decided (the caller writes status from it)."""

    reconciliation: Reconciliation
    observed: FleetObservation
    pods: list[Obj]
    """Every pod of the card (workers and routers) as the watch cache held them this round."""


@dataclass(frozen=True)
class PlannerView:
    """The planner's inputs the observation does not carry."""

    urls: dict[str, str]
    """Worker -> its HTTP base URL (for /metrics)."""
    statuses: dict[str, WorkerStatus | None]
    """Worker -> its last Status."""
    held: int
    """Requests the routers hold for want of a serving worker."""
    unschedulable: dict[RoleName, int] = field(default_factory=dict)
    """Role -> its pods the scheduler cannot place."""


class PodFleet:
    """The fleet of one DeploymentCard; call `round` repeatedly, `close` at the end."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        record: FleetRecord,
        events: Events,
        wake: asyncio.Event | None = None,
    ) -> None:
        self._kube, self.namespace, self.name = kube, namespace, name
        self.record = record
        self._events = events
        self._observer: Observer | None = None
        self._admin_token = ""
        self._routers: dict[str, RouterAdmin] = {}
        self._in_flight: dict[str, int] = {}
        """Worker -> requests in flight to it summed over the routers that answered."""
        self._routed_as: dict[str, str] = {}
        """Worker -> the version every router that answered routes it as (absent: some router
        does not route it, or they disagree)."""
        self._routers_answered = False
        self._held = 0
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._incarnations: dict[str, tuple[str, int]] = {}
        self._workers: dict[str, PodWorker] = {}
        self._pods: list[Obj] = []
        self.wake = wake or asyncio.Event()
        """Set when a LoadWeights call ends between rounds (the card's wake-up, shared with
        the watches)."""

    async def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return await asyncio.to_thread(partial(fn, *args, **kw))

    async def _tokens(self) -> Observer:
        """The workers' control token and the routers' admin token, from the card's Secret."""
        if self._observer is None:
            path = object_path("Secret", self.namespace, control_secret(self.name))
            data = (await self._call(self._kube.get, path)).get("data") or {}
            token = base64.b64decode(data.get("token", "")).decode()
            self._admin_token = base64.b64decode(data.get("admin-token", "")).decode()
            self._observer = Observer(token)
        return self._observer

    async def admin_token(self) -> str:
        """The card's admin token (the routers' and the push API's)."""
        await self._tokens()
        return self._admin_token

    def control(self, worker: str) -> ControlClient | None:
        """The control client of a worker pod the last look saw alive (None: not one now)."""
        pod = self._workers.get(worker)
        if self._observer is None or pod is None or not pod.alive or pod.ip is None:
            return None
        return self._observer.control(pod)

    # -- observe ----------------------------------------------------------------------------

    async def _ask_routers(self, pods: list[Obj]) -> None:
        """In-flight requests per worker and held requests, summed over the routers."""
        live = {}
        for pod in pods:
            meta, status = pod["metadata"], pod.get("status") or {}
            if (meta.get("labels") or {}).get(COMPONENT_LABEL) != "router":
                continue
            if status.get("podIP") and pod_ready(pod):
                live[str(meta["name"])] = str(status["podIP"])
        for gone in set(self._routers) - set(live):
            await self._routers.pop(gone).close()
        for name, ip in live.items():
            url = f"http://{ip}:{ROUTER_PORTS[ROUTER_ADMIN_PORT]}"
            if name not in self._routers or self._routers[name].base_url != url:
                self._routers[name] = RouterAdmin(url, self._admin_token)
        answers = []
        held = 0
        for name, admin in self._routers.items():
            try:
                records = await admin.endpoints()
                metrics = f"http://{live[name]}:{ROUTER_PORTS[HTTP_PORT]}/metrics"
                held += await admin.held_requests(metrics)
            except RouterAdminError as exc:
                logger.debug("%s/%s: router %s did not answer: %s", self.namespace, self.name,
                            name, exc)  # fmt: skip
                continue
            answers.append(records)
        self._in_flight, self._routed_as = in_flight_by_worker(answers), routed_as(answers)
        self._held, self._routers_answered = held, bool(answers)

    async def observe(
        self, now: float, pods: list[Obj]
    ) -> tuple[FleetObservation, dict[str, PodWorker], list[Obj]]:
        """Probe the workers among `pods` (the card's pods as the watch cache holds them)."""
        observer = await self._tokens()
        # A Terminating pod is a voluntary, graceful stop, not a failure: it finishes its requests
        # (the router sends it nothing new) and the StatefulSet replaces it; the core sees the
        # slot empty until then. A crash mid-drain is the router's to migrate, as always.
        workers = {
            w.name: w for w in (pod_worker(p) for p in pods) if w is not None and not w.terminating
        }
        for name, w in workers.items():
            if self._incarnations.get(name) != w.incarnation:
                observer.forget(
                    name
                )  # a new pod or a restarted container: old numbers mean nothing
                self._incarnations[name] = w.incarnation
        for name in set(self._incarnations) - set(workers):
            del self._incarnations[name]
            observer.forget(name)
        reachable = {n: w.alive and w.ip is not None for n, w in workers.items()}
        probed = [w for w in workers.values() if reachable[w.name]]
        probes = await observer.probe_all(probed, reachable, now)
        await self._ask_routers(pods)
        states = [
            worker_state(
                w, probes.get(w.name), observer.seen(w.name), self._in_flight.get(w.name, 0),
                w.name in self._loads, self._router_routes(w),
            )
            for w in workers.values()
        ]  # fmt: skip
        return FleetObservation(tuple(states), now, held_requests=self._held), workers, pods

    async def look(self, now: float, pods: list[Obj]) -> tuple[FleetObservation, list[Obj]]:
        """Observe this round's workers (kept for `decide` and `execute`) among `pods`."""
        observed, self._workers, self._pods = await self.observe(now, pods)
        return observed, self._pods

    def decide(self, desired: DesiredFleet, observed: FleetObservation, pods: list[Obj]) -> Round:
        """Reconcile; `execute` the actions once the record is persisted."""
        return Round(reconcile(desired, observed, self.record), observed, pods)

    def planner_view(self) -> PlannerView:
        """What the planner reads of this round's workers, beyond the observation."""
        observer = self._observer
        urls = {n: w.url for n, w in self._workers.items() if w.alive and w.ip is not None}
        statuses = {n: None if observer is None else observer.seen(n).status for n in urls}
        return PlannerView(urls, statuses, self._held, unschedulable(self._pods))

    # -- act --------------------------------------------------------------------------------

    async def execute(self, r: Round, desired: DesiredFleet) -> None:
        """Carry out the worker actions in order; a failed one is retried by a later round
        (the core asserts its actions again)."""
        self.record = r.reconciliation.record
        for action in r.reconciliation.actions:
            try:
                await self._do(action, r.observed, desired)
            except (ControlError, RouterAdminError, KubeError) as exc:
                worker = getattr(action, "worker", "")
                logger.warning("%s/%s: %s %s failed (retried next round): %s", self.namespace,
                               self.name, type(action).__name__, worker, exc)  # fmt: skip

    async def _route(self, worker: str, version: str | None) -> None:
        path = object_path("Pod", self.namespace, worker)
        try:
            await self._call(self._kube.patch, path, route_patch(version))
        except KubeError as exc:
            if exc.status != 404:  # a pod that is gone needs no routing
                raise

    def _router_routes(self, pod: PodWorker) -> bool:
        """Every router that answered routes `pod` as its annotated version (True when none
        answered: without routers there is nothing to wait for)."""
        if not self._routers_answered:
            return True
        return (
            pod.routed_version is not None and self._routed_as.get(pod.name) == pod.routed_version
        )

    def _quiet(self, worker: str) -> bool:
        return not self._routers_answered or self._in_flight.get(worker, 0) == 0

    async def _do(self, a: Action, observed: FleetObservation, desired: DesiredFleet) -> None:
        pod = self._workers.get(getattr(a, "worker", ""))
        state = observed.get(getattr(a, "worker", ""))
        live = pod is not None and pod.alive and pod.ip is not None
        observer = await self._tokens()
        if isinstance(a, SetCondition):
            return
        if isinstance(a, RouteOff):
            if pod is not None and not pod.draining:
                await self._route(a.worker, None)
                self._events("RouteOff", f"{a.worker} out of routing: {a.reason}", "Warning")
        elif isinstance(a, Freeze):
            if pod is not None and not pod.draining:
                await self._route(a.worker, None)
                self._events("Freeze", f"draining {a.worker}", "Normal")
            elif live and pod is not None and self._quiet(a.worker):
                await observer.control(pod).pause("wait", FREEZE_WAIT_S, CALL_TIMEOUT_S)
        elif isinstance(a, MigrateRequests):
            for admin in self._routers.values():
                await admin.op(a.worker, "migrate")
            if a.abort and live and pod is not None:
                await observer.control(pod).pause("abort", 0.0, CALL_TIMEOUT_S)
            self._events("Migrate", f"migrating {a.worker}'s requests: {a.reason}", "Warning")
        elif isinstance(a, RestartWorker):
            if live and pod is not None and state is not None and not state.ready:
                path = object_path("Pod", self.namespace, a.worker)
                body = {"preconditions": {"uid": pod.uid}}
                await self._call(self._kube.delete, path, body)
                msg = f"deleted {a.worker} (attempt {a.attempt}): {a.reason}"
                self._events("Restart", msg, "Warning")
        elif isinstance(a, StartWorker | StopWorker):
            return  # the StatefulSet creates and removes pods
        elif isinstance(a, LoadWeights):
            if live and pod is not None:
                self._load(a, pod, observer, desired.sync.load_timeout_s, observed)
        elif isinstance(a, Resume):
            if live and pod is not None:
                status = await observer.control(pod).resume(CALL_TIMEOUT_S)
                await self._route(a.worker, status.weights_version)
                self._events("Resume", f"{a.worker} serves {status.weights_version}", "Normal")
        elif isinstance(a, RouteOn) and pod is not None:
            version = None if state is None else state.weights_version
            if version is not None and (pod.draining or pod.routed_version != version):
                await self._route(a.worker, version)
                self._events("RouteOn", f"{a.worker} routed on {version}", "Normal")
            # else: annotated already; it counts as routed once every router routes it

    def _load(
        self, a: LoadWeights, pod: PodWorker, observer: Observer, timeout: float,
        observed: FleetObservation,
    ) -> None:  # fmt: skip
        if a.worker in self._loads:
            return
        client = observer.control(pod)
        peer = rebuild_peer(a, observed, self._workers) if a.source.startswith(PUSH_SCHEME) else ""

        async def load() -> None:
            try:
                status = await client.load_weights(a.source, a.version, timeout, a.kv, peer)
                self._events("LoadWeights", f"{a.worker} loaded {status.weights_version}", "Normal")
            except ControlError as exc:
                self._events("LoadWeights", f"{a.worker}: {exc}", "Warning")
            finally:
                self._loads.pop(a.worker, None)
                self.wake.set()

        self._events("LoadWeights", f"{a.worker}: loading {a.version}", "Normal")
        self._loads[a.worker] = asyncio.create_task(load(), name=f"load-{a.worker}")

    @property
    def busy(self) -> bool:
        return bool(self._loads)

    async def close(self) -> None:
        for task in self._loads.values():
            task.cancel()
        if self._observer is not None:
            await self._observer.close()
        for admin in self._routers.values():
            await admin.close()
