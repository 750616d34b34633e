"""The operator's scaling plumbing, one card: the scale rule's writes (a `kubectl scale` on a
RoleScale lands in the card; an edited card lands in the RoleScale), the planner's decision
written into the RoleScale with an event, a condition and a metric, each StatefulSet's
replicas lowered only once the fleet core has stopped the retiring worker, and a role the card
dropped lowered the same way, then its StatefulSet, Service and RoleScale deleted.

`InMemoryApi` is a stand-in for the API server (objects by path, merge patches, generations,
server-side applies recorded): the real one runs in the e2e suite (e2e/test_autoscale.py)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any, cast

import yaml
from prometheus_client import generate_latest

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import load_documents, parse_documents
from loom_operator.api.roles import RoleName
from loom_operator.fleet.actions import StopWorker
from loom_operator.fleet.controller import Reconciliation
from loom_operator.fleet.desired import DesiredFleet, autoscale_policy, desired_fleet
from loom_operator.fleet.observed import FleetObservation, WorkerState
from loom_operator.fleet.record import FleetRecord
from loom_operator.k8s.fleet import PlannerView, PodFleet, Round
from loom_operator.k8s.kube import Kube, KubeError, object_path
from loom_operator.k8s.labels import SCALE_MANAGER
from loom_operator.k8s.metrics import OperatorMetrics
from loom_operator.k8s.render.role_scale import role_scale_manifest
from loom_operator.k8s.scaler import CardScaler

LABEL = "loom.dev/deployment"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
NS = "ns"
Obj = dict[str, Any]


class InMemoryApi:
    """Stand-in for the API server: GET (one object or a labelled collection), merge PATCH
    (a spec change bumps metadata.generation), server-side apply of a StatefulSet's replicas."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.applied: list[tuple[str, int, str]] = []

    def put(self, kind: str, obj: Obj) -> None:
        obj["metadata"].setdefault("generation", 1)
        self.objects[object_path(kind, NS, obj["metadata"]["name"])] = obj

    def get(self, path: str, **query: Any) -> Obj:
        if path in self.objects:
            return copy.deepcopy(self.objects[path])
        key, _, value = str(query.get("labelSelector", "")).partition("=")
        items = [
            copy.deepcopy(o) for p, o in self.objects.items()
            if p.startswith(path + "/") and o["metadata"].get("labels", {}).get(key) == value
        ]  # fmt: skip
        return {"items": items}

    def patch(self, path: str, body: Obj, content_type: str = "") -> Obj:
        if path.endswith("/status"):
            obj = self.objects[path.removesuffix("/status")]
            obj.setdefault("status", {}).update(body["status"])
            return copy.deepcopy(obj)
        obj = self.objects[path]
        _merge(obj, body)
        if "spec" in body:
            obj["metadata"]["generation"] += 1
        return copy.deepcopy(obj)

    def delete(self, path: str, body: Obj | None = None) -> Obj:
        if path not in self.objects:
            raise KubeError(404, f"{path} not found")
        return self.objects.pop(path)

    def apply(self, manifest: Obj, field_manager: str) -> Obj:
        name = manifest["metadata"]["name"]
        self.applied.append((name, manifest["spec"]["replicas"], field_manager))
        obj = self.objects[object_path(manifest["kind"], NS, name)]
        obj["spec"]["replicas"] = manifest["spec"]["replicas"]
        return copy.deepcopy(obj)


def _merge(into: Obj, patch: Obj) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def card(autoscaling: Obj | None = None, decode: int = 1) -> tuple[Obj, DeploymentCard]:
    model, deployment = yaml.safe_load_all((EXAMPLES / "tiny-pd.yaml").read_text())
    for doc in (model, deployment):
        doc["metadata"]["namespace"] = NS
    deployment["spec"]["roles"]["decode"]["replicas"] = decode
    if autoscaling is not None:
        deployment["spec"]["autoscaling"] = autoscaling
    cards = parse_documents([(0, model), (1, deployment)], NS)
    return deployment, cards.deployment_cards[0]


def api_with(deployment: Obj) -> InMemoryApi:
    api = InMemoryApi()
    api.put("DeploymentCard", copy.deepcopy(deployment))
    for role in ("prefill", "decode"):
        scale = role_scale_manifest("tiny-pd", role)
        api.put("RoleScale", scale)
    return api


def scaler(
    api: InMemoryApi, metrics: OperatorMetrics | None = None
) -> tuple[CardScaler, list[str]]:
    said: list[str] = []
    events = lambda reason, message, kind: said.append(f"{reason}: {message}")  # noqa: E731
    return CardScaler(cast(Kube, api), NS, "tiny-pd", events, metrics), said


def scales(api: InMemoryApi) -> list[Obj]:
    """The card's RoleScales as the operator's watch cache holds them: as the API server has
    them now."""
    items: list[Obj] = api.get(object_path("RoleScale", NS), labelSelector=f"{LABEL}=tiny-pd")[
        "items"
    ]
    return items


def role_scale(api: InMemoryApi, role: str) -> Obj:
    return api.objects[object_path("RoleScale", NS, f"tiny-pd-{role}")]


def worker(name: str) -> WorkerState:
    role = cast(RoleName, name.split("-")[-2])
    return WorkerState(name=name, role=role, weights_version="v1", address="10.0.0.1:8000")


def test_kubectl_scale_without_autoscaling_is_written_into_the_card() -> None:
    doc, deployment = card()
    api = api_with(doc)
    s, said = scaler(api)
    counts = asyncio.run(s.settle(deployment, 1, scales(api)))
    assert counts == {"prefill": 1, "decode": 1}
    assert role_scale(api, "decode")["spec"]["replicas"] == 1  # a new RoleScale mirrors the card
    api.patch(object_path("RoleScale", NS, "tiny-pd-decode"), {"spec": {"replicas": 3}})
    counts = asyncio.run(s.settle(deployment, 1, scales(api)))  # the watched card still says 1
    assert counts["decode"] == 3
    card_obj = api.objects[object_path("DeploymentCard", NS, "tiny-pd")]
    assert card_obj["spec"]["roles"]["decode"]["replicas"] == 3
    assert any("written into spec.roles.decode.replicas" in e for e in said)
    # until the watch brings the edited card, the count taken from the RoleScale holds
    assert asyncio.run(s.settle(deployment, 1, scales(api)))["decode"] == 3
    assert role_scale(api, "decode")["spec"]["replicas"] == 3


def test_an_edited_card_moves_its_role_scale() -> None:
    doc, deployment = card()
    api = api_with(doc)
    s, _ = scaler(api)
    asyncio.run(s.settle(deployment, 1, scales(api)))
    _, edited = card(decode=2)
    assert asyncio.run(s.settle(edited, 2, scales(api)))["decode"] == 2
    assert role_scale(api, "decode")["spec"]["replicas"] == 2


def test_the_planner_writes_its_decision_into_the_role_scale_and_says_it() -> None:
    section = {"decode": {"min": 1, "max": 3}, "scaleUpSeconds": 0, "targets": {"queue": 2}}
    doc, deployment = card(section)
    api = api_with(doc)
    metrics = OperatorMetrics()
    s, said = scaler(api, metrics)
    counts = asyncio.run(s.settle(deployment, 1, scales(api)))
    assert deployment.spec.autoscaling is not None
    policy = autoscale_policy(deployment.spec.autoscaling)
    observed = FleetObservation((worker("tiny-pd-prefill-0"), worker("tiny-pd-decode-0")), 100.0)
    view = PlannerView({}, {}, held=5)  # five requests held for decode: 2.5 per worker, target 2

    async def plan() -> dict[RoleName, int]:
        try:
            return dict(await s.plan(policy, counts, observed, view, 100.0, 1))
        finally:
            await s.close()

    planned = asyncio.run(plan())
    assert planned == {"prefill": 1, "decode": 2}
    assert role_scale(api, "decode")["spec"]["replicas"] == 2
    assert any(e.startswith("Autoscale: scaling up decode 1 → 2 (QueueAboveTarget") for e in said)
    assert s.condition is not None and s.condition["reason"] == "QueueAboveTarget"
    text = generate_latest(metrics.registry).decode()
    assert (
        'loom:operator_planned_replicas{deployment="tiny-pd",namespace="ns",role="decode"} 2.0'
        in text
    )
    assert 'reason="QueueAboveTarget",role="decode"} 1.0' in text
    # the planner's own write is taken in: the next settle keeps 2 and writes nothing back
    counts = asyncio.run(s.settle(deployment, 1, scales(api)))
    assert counts["decode"] == 2
    r = Round(Reconciliation((), FleetRecord(), (), None), observed, [])
    asyncio.run(s.follow(counts, r, {}))
    status = role_scale(api, "decode")["status"]
    assert (status["desiredReplicas"], status["reason"]) == (2, "QueueAboveTarget")
    assert status["observedGeneration"] == role_scale(api, "decode")["metadata"]["generation"]


def test_with_the_planner_off_an_hpa_count_is_clamped_into_the_bounds() -> None:
    doc, deployment = card({"decode": {"min": 1, "max": 3}, "planner": False})
    api = api_with(doc)
    s, said = scaler(api)
    asyncio.run(s.settle(deployment, 1, scales(api)))
    api.patch(object_path("RoleScale", NS, "tiny-pd-decode"), {"spec": {"replicas": 8}})
    assert asyncio.run(s.settle(deployment, 1, scales(api)))["decode"] == 3
    assert role_scale(api, "decode")["spec"]["replicas"] == 3
    assert any("clamped to 3" in e for e in said)
    assert deployment.spec.autoscaling is not None
    policy = autoscale_policy(deployment.spec.autoscaling)
    observed = FleetObservation((), 1.0)
    same = asyncio.run(s.plan(policy, {"decode": 3}, observed, PlannerView({}, {}, 9), 1.0, 1))
    assert same == {"decode": 3} and s.condition is None  # no planner, no decision


def test_a_statefulset_drops_a_retiring_pod_only_once_the_core_stopped_it() -> None:
    doc, deployment = card()
    api = api_with(doc)
    for role, n in (("prefill", 1), ("decode", 3)):
        api.put("StatefulSet", {"metadata": {"name": f"tiny-pd-{role}", "labels": {}},
                                "spec": {"replicas": n}})  # fmt: skip
    s, _ = scaler(api)
    asyncio.run(s.settle(deployment, 1, scales(api)))
    workers = tuple(worker(n) for n in ("tiny-pd-prefill-0", "tiny-pd-decode-0",
                                        "tiny-pd-decode-1", "tiny-pd-decode-2"))  # fmt: skip
    observed = FleetObservation(workers, 1.0)

    def follow(stopped: tuple[str, ...]) -> None:
        actions = tuple(StopWorker(w, "scaled down") for w in stopped)
        r = Round(Reconciliation(actions, FleetRecord(), (), None), observed, [])
        sets = {n.rsplit("/", 1)[1]: o for n, o in api.objects.items() if "/statefulsets/" in n}
        asyncio.run(s.follow({"prefill": 1, "decode": 1}, r, sets))

    follow(())  # both extras drain: every pod stays; the scaler takes the count over
    assert ("tiny-pd-decode", 3, SCALE_MANAGER) in api.applied
    assert api.objects[object_path("StatefulSet", NS, "tiny-pd-decode")]["spec"]["replicas"] == 3
    follow(("tiny-pd-decode-2",))
    assert api.objects[object_path("StatefulSet", NS, "tiny-pd-decode")]["spec"]["replicas"] == 2
    status = role_scale(api, "decode")["status"]
    assert status["desiredReplicas"] == 1 and status["replicas"] == 3
    assert status["selector"] == "loom.dev/deployment=tiny-pd,loom.dev/role=decode"


def test_the_planner_does_not_grow_a_role_whose_pods_cannot_be_scheduled() -> None:
    section = {"decode": {"min": 1, "max": 3}, "scaleUpSeconds": 0, "targets": {"queue": 2}}
    doc, deployment = card(section)
    api = api_with(doc)
    s, said = scaler(api)
    counts = asyncio.run(s.settle(deployment, 1, scales(api)))
    assert deployment.spec.autoscaling is not None
    policy = autoscale_policy(deployment.spec.autoscaling)
    observed = FleetObservation((worker("tiny-pd-prefill-0"), worker("tiny-pd-decode-0")), 100.0)
    view = PlannerView({}, {}, held=9, unschedulable={"decode": 1})

    async def plan() -> dict[RoleName, int]:
        try:
            return dict(await s.plan(policy, counts, observed, view, 100.0, 1))
        finally:
            await s.close()

    assert asyncio.run(plan())["decode"] == 1
    assert s.condition is not None and s.condition["reason"] == "Unschedulable"
    assert not [e for e in said if e.startswith("Autoscale")]


class PodsSeen:
    """Stand-in for PodFleet's planner and decide parts: fixed workers, the desired fleet kept."""

    def __init__(self, observed: FleetObservation, held: int) -> None:
        self.observed, self.held = observed, held
        self.decided: DesiredFleet | None = None

    def planner_view(self) -> PlannerView:
        return PlannerView({}, {}, self.held)

    def decide(self, desired: DesiredFleet, observed: FleetObservation, pods: list[Obj]) -> Round:
        self.decided = desired
        return Round(Reconciliation((), FleetRecord(), (), None), observed, pods)


def test_a_round_hands_the_fleet_core_the_planned_counts() -> None:
    section = {"decode": {"min": 1, "max": 3}, "scaleUpSeconds": 0, "targets": {"queue": 2}}
    doc, deployment = card(section)
    api = api_with(doc)
    s, _ = scaler(api)
    observed = FleetObservation((worker("tiny-pd-prefill-0"), worker("tiny-pd-decode-0")), 100.0)
    pods = PodsSeen(observed, held=5)
    model = load_documents(EXAMPLES / "tiny-pd.yaml").model_cards[0]

    async def run() -> tuple[DesiredFleet, dict[RoleName, int]]:
        try:
            desired, counts, _ = await s.round(
                cast(PodFleet, pods), (observed, []), scales(api),
                desired_fleet(model, deployment), deployment, 1, 100.0,
            )  # fmt: skip
            return desired, counts
        finally:
            await s.close()

    desired, counts = asyncio.run(run())
    assert counts == {"prefill": 1, "decode": 2}
    assert pods.decided is desired and desired.replicas("decode") == 2
    assert [w.name for w in desired.slots] == [
        "tiny-pd-prefill-0", "tiny-pd-decode-0", "tiny-pd-decode-1",
    ]  # fmt: skip


def test_a_role_the_card_dropped_drains_then_its_objects_are_deleted() -> None:
    doc, deployment = card()  # prefill + decode: the card no longer has its aggregated role
    api = api_with(doc)
    for role, n in (("prefill", 1), ("decode", 1), ("aggregated", 1)):
        labels = {LABEL: "tiny-pd", "loom.dev/role": role}
        api.put("StatefulSet", {"metadata": {"name": f"tiny-pd-{role}", "labels": labels},
                                "spec": {"replicas": n}})  # fmt: skip
    api.put("Service", {"metadata": {"name": "tiny-pd-aggregated"}})
    api.put("RoleScale", role_scale_manifest("tiny-pd", "aggregated"))
    metrics = OperatorMetrics()
    s, said = scaler(api, metrics)
    counts = asyncio.run(s.settle(deployment, 1, scales(api)))
    assert set(counts) == {"prefill", "decode"}
    serving = ("tiny-pd-prefill-0", "tiny-pd-decode-0")

    def follow(workers: tuple[str, ...], stopped: tuple[str, ...] = ()) -> None:
        actions = tuple(StopWorker(w, "its role was dropped") for w in stopped)
        observed = FleetObservation(tuple(worker(n) for n in workers), 1.0)
        r = Round(Reconciliation(actions, FleetRecord(), (), None), observed, [])
        sets = {n.rsplit("/", 1)[1]: copy.deepcopy(o) for n, o in api.objects.items()
                if "/statefulsets/" in n}  # fmt: skip
        asyncio.run(s.follow(counts, r, sets))

    def present(kind: str) -> bool:
        return object_path(kind, NS, "tiny-pd-aggregated") in api.objects

    follow((*serving, "tiny-pd-aggregated-0"))  # draining: its pod stays
    assert (
        api.objects[object_path("StatefulSet", NS, "tiny-pd-aggregated")]["spec"]["replicas"] == 1
    )
    follow((*serving, "tiny-pd-aggregated-0"), stopped=("tiny-pd-aggregated-0",))
    assert (
        api.objects[object_path("StatefulSet", NS, "tiny-pd-aggregated")]["spec"]["replicas"] == 0
    )
    assert all(present(k) for k in ("StatefulSet", "Service", "RoleScale"))  # its pod still goes
    follow(serving)
    assert not any(present(k) for k in ("StatefulSet", "Service", "RoleScale"))
    assert any(e.startswith("RoleRemoved: aggregated is no longer in the card") for e in said)
    follow(serving)  # nothing left to do: the next round deletes nothing again
    assert object_path("StatefulSet", NS, "tiny-pd-decode") in api.objects
