"""The watch caches as handlers read them: objects by the card their label names, without
managedFields but the scaler's (a pod's spec cut to its containers' ports and a StatefulSet's pod
template to its volumes: all a round reads of them), and one card's objects gathered from kopf's
indexes; the card daemons' wake-ups."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from loom_operator.api.documents import load_documents
from loom_operator.k8s.drift import marker
from loom_operator.k8s.labels import FIELD_MANAGER, SCALE_MANAGER
from loom_operator.k8s.pods import pod_worker
from loom_operator.k8s.render import render
from loom_operator.k8s.render.model_volumes import mounted_claims
from loom_operator.k8s.scale_status import owns_replicas
from loom_operator.k8s.scaler import replicas_of
from loom_operator.k8s.settings import RenderSettings
from loom_operator.k8s.wakers import CardWakers
from loom_operator.k8s.watched import (
    ROUND_KINDS,
    card_cache,
    card_key,
    marker_index,
    slim,
    slim_pod,
    slim_statefulset,
)

LABEL = "loom.dev/deployment"


def obj(name: str, card: str | None, **meta: Any) -> dict[str, Any]:
    labels = {} if card is None else {LABEL: card}
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels, **meta}}


def test_objects_are_keyed_by_the_card_their_label_names() -> None:
    assert card_key(obj("c-decode-0", "c")) == ("ns", "c")
    assert card_key(obj("other", None)) is None


def test_slim_drops_managed_fields_but_the_scalers_own() -> None:
    fields = [
        {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {}}},
        {"manager": SCALE_MANAGER, "operation": "Apply",
         "fieldsV1": {"f:spec": {"f:replicas": {}}}},
    ]  # fmt: skip
    sts = slim(obj("c-decode", "c", managedFields=fields, resourceVersion="4"))
    assert sts["metadata"]["managedFields"] == fields[1:] and owns_replicas(sts, SCALE_MANAGER)
    pod = slim(obj("c-decode-0", "c", managedFields=fields[:1]))
    assert "managedFields" not in pod["metadata"] and pod["metadata"]["name"] == "c-decode-0"


def test_slim_pods_and_statefulsets_keep_what_a_round_reads_of_them() -> None:
    cards = load_documents(Path(__file__).resolve().parents[3] / "examples" / "tiny-pd.yaml")
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    objects = render(model, deployment, "uid", RenderSettings())
    (sts,) = [o for o in objects if o["kind"] == "StatefulSet" and o["spec"]["replicas"] and
              o["metadata"]["name"].endswith("decode")]  # fmt: skip
    template = sts["spec"]["template"]
    pod = {
        "metadata": {**template["metadata"], "name": "c-decode-0", "namespace": "ns", "uid": "u1"},
        "spec": template["spec"],
        "status": {"phase": "Running", "podIP": "10.0.0.7", "containerStatuses": [
            {"restartCount": 2, "state": {"running": {"startedAt": "2026-12-07T10:00:00Z"}}}]},
    }  # fmt: skip
    kept = slim_pod(pod)
    assert pod_worker(kept) == pod_worker(pod) and pod_worker(pod) is not None
    assert kept["status"] == pod["status"] and kept["metadata"] == pod["metadata"]
    (container,) = kept["spec"]["containers"]
    assert set(container) == {"name", "ports"} and container["ports"]
    assert len(repr(kept["spec"])) < len(repr(pod["spec"])) / 4
    volumes = [{"name": "weights", "persistentVolumeClaim": {"claimName": "models"}}]
    sts["spec"]["template"]["spec"]["volumes"] = volumes
    kept_sts = slim_statefulset(sts)
    assert mounted_claims(kept_sts) == mounted_claims(sts) == ("models",)
    assert replicas_of(kept_sts) == replicas_of(sts) and kept_sts["metadata"] == sts["metadata"]
    assert kept_sts["spec"]["template"] == {"spec": {"volumes": volumes}}


def test_a_cards_cache_gathers_its_model_card_statefulsets_and_drift_markers() -> None:
    card = {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"modelCard": "m"}}
    sts = obj("c-decode", "c", generation=2, resourceVersion="40")
    scale = obj("c-decode", "c", generation=3)
    indexes = {
        "model_cards": {("ns", "m"): [{"spec": {"x": 1}}]},
        ROUND_KINDS["StatefulSet"]: {("ns", "c"): [sts], ("ns", "d"): [obj("d-decode", "d")]},
        ROUND_KINDS["RoleScale"]: {("ns", "c"): [scale]},
        marker_index("ConfigMap"): {("ns", "c"): [("ConfigMap", "c-cards", "r7")]},
    }
    cache = card_cache(indexes, card)
    assert cache.model_doc == {"spec": {"x": 1}} and cache.statefulsets == [sts]
    assert cache.markers == {("StatefulSet", "c-decode"): marker(sts),
                             ("RoleScale", "c-decode"): marker(scale),
                             ("ConfigMap", "c-cards"): "r7"}  # fmt: skip
    other = card_cache({}, card | {"spec": {"modelCard": "gone"}})
    assert other.model_doc is None and other.statefulsets == [] and other.markers == {}


def test_a_watch_wakes_only_the_daemon_of_its_card() -> None:
    async def run() -> None:
        wakers = CardWakers()
        a, b = wakers.event(("ns", "a")), wakers.event(("ns", "b"))
        wakers.wake(("ns", "a"))
        wakers.wake(("ns", "unknown"))  # no daemon: nothing is made for it
        assert a.is_set() and not b.is_set() and wakers.pending() == 1
        wakers.wake_namespace("ns")
        assert b.is_set() and wakers.pending() == 2
        wakers.forget(("ns", "a"))
        assert wakers.pending() == 1

    asyncio.run(run())
