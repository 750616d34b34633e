"""What the operator refuses before rendering: cards that do not parse together — a readable
Valid=False, never ignored — and what it serves (an autoscaling section: the planner runs);
what a reconcile sends: nothing for a converged card, and what was edited or deleted by hand
(a StatefulSet's labels, the token Secret, which comes back with the tokens it held)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kopf
import yaml

from loom_operator.k8s.drift import Applied, marker
from loom_operator.k8s.kube import KubeError, object_path
from loom_operator.k8s.labels import control_secret
from loom_operator.k8s.reconcile import load_cards, reconcile
from loom_operator.k8s.settings import RenderSettings
from loom_operator.k8s.watched import CardCache

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def documents() -> tuple[dict[str, Any], dict[str, Any]]:
    model, deployment = yaml.safe_load_all((EXAMPLES / "tiny-pd.yaml").read_text())
    for doc in (model, deployment):
        doc["metadata"]["namespace"] = "ns"
    return model, deployment


def test_valid_cards_load() -> None:
    model, deployment = documents()
    loaded = load_cards(model, deployment)
    assert not isinstance(loaded, str)


def test_an_autoscaling_section_is_served_on_kubernetes() -> None:
    model, deployment = documents()
    deployment["spec"]["autoscaling"] = {"decode": {"min": 1, "max": 3}}
    loaded = load_cards(model, deployment)
    assert not isinstance(loaded, str), loaded
    assert loaded[1].spec.autoscaling is not None


def test_a_missing_model_card_is_named() -> None:
    _, deployment = documents()
    assert load_cards(None, deployment) == "spec.modelCard: no ModelCard 'tiny' in ns"


class RecordingKube:
    """A stand-in API server for one card: it stores what is applied or created, answers GETs of
    it, and records every request by verb."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    def _store(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = {**body["metadata"], "resourceVersion": str(len(self.calls)), "generation": 1}
        self.objects[path] = {**body, "metadata": meta}
        return self.objects[path]

    def apply(self, manifest: dict[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply, as far as reconcile reads it: the spec merged, the manager of
        spec.replicas recorded."""
        meta = manifest["metadata"]
        path = object_path(manifest["kind"], meta["namespace"], meta["name"])
        self.calls.append(("apply", path))
        old = self.objects.get(path, {"metadata": {}})
        body = {**old, **manifest, "spec": {**old.get("spec", {}), **manifest.get("spec", {})}}
        fields = list(old["metadata"].get("managedFields") or [])
        if "replicas" in manifest.get("spec", {}):
            fields.append({"manager": field_manager, "operation": "Apply",
                           "fieldsV1": {"f:spec": {"f:replicas": {}}}})  # fmt: skip
        body["metadata"] = {**old["metadata"], **meta, "managedFields": fields}
        return self._store(path, body)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        path = f"{path}/{body['metadata']['name']}"
        self.calls.append(("create", path))
        if path in self.objects:
            raise KubeError(409, "AlreadyExists")
        data = {k: base64.b64encode(v.encode()).decode() for k, v in body["stringData"].items()}
        return self._store(path, {**body, "data": data})

    def get(self, path: str) -> dict[str, Any]:
        self.calls.append(("get", path))
        if path not in self.objects:
            raise KubeError(404, "NotFound")
        return self.objects[path]


def cache_of(kube: RecordingKube, model: dict[str, Any]) -> CardCache:
    """The watch cache as it stands once every event of `kube`'s objects arrived."""
    markers = {(o["kind"], o["metadata"]["name"]): marker(o) for o in kube.objects.values()}
    sets = [o for o in kube.objects.values() if o["kind"] == "StatefulSet"]
    return CardCache(model, sets, markers)


def test_a_token_secret_deleted_by_hand_comes_back_with_the_same_tokens() -> None:
    model, deployment = documents()
    deployment["metadata"] |= {"uid": "uid-1", "generation": 1}
    kube, applied = RecordingKube(), Applied()
    memo = kopf.Memo(kube=kube, settings=RenderSettings(), applied=applied)
    assert reconcile(deployment, memo, cache_of(kube, model)) is None
    secret = object_path("Secret", "ns", control_secret("tiny-pd"))
    tokens = dict(kube.objects[secret]["data"])
    kube.calls.clear()
    reconcile(deployment, memo, cache_of(kube, model), again=True)
    assert kube.calls == [], "a converged card whose cache holds everything sends nothing"
    del kube.objects[secret]
    reconcile(deployment, memo, cache_of(kube, model), again=True)
    assert kube.calls == [("create", secret)]
    assert kube.objects[secret]["data"] == tokens, "the running pods' tokens, not new ones"


def test_a_token_secret_made_before_this_process_is_read_and_kept() -> None:
    model, deployment = documents()
    deployment["metadata"] |= {"uid": "uid-1", "generation": 1}
    kube = RecordingKube()
    secret = object_path("Secret", "ns", control_secret("tiny-pd"))
    kube.create(
        object_path("Secret", "ns"),
        {
            "kind": "Secret",
            "metadata": {"name": control_secret("tiny-pd")},
            "stringData": {"token": "t", "admin-token": "a"},
        },
    )
    applied = Applied()
    memo = kopf.Memo(kube=kube, settings=RenderSettings(), applied=applied)
    reconcile(deployment, memo, cache_of(kube, model))
    assert applied.secret_data("ns", "uid-1") == {"token": "t", "admin-token": "a"}
    del kube.objects[secret]
    reconcile(deployment, memo, cache_of(kube, model), again=True)
    assert kube.objects[secret]["data"] == {"token": "dA==", "admin-token": "YQ=="}


def test_a_label_edited_by_hand_on_a_statefulset_is_applied_again() -> None:
    """A label edit leaves the generation: the marker holds the labels too."""
    model, deployment = documents()
    deployment["metadata"] |= {"uid": "uid-1", "generation": 1}
    kube, applied = RecordingKube(), Applied()
    memo = kopf.Memo(kube=kube, settings=RenderSettings(), applied=applied)
    reconcile(deployment, memo, cache_of(kube, model))
    sts = object_path("StatefulSet", "ns", "tiny-pd-decode")
    kube.objects[sts]["metadata"]["labels"] = {"loom.dev/deployment": "tiny-pd", "by": "hand"}
    kube.calls.clear()
    reconcile(deployment, memo, cache_of(kube, model), again=True)
    assert kube.calls == [("apply", sts)]
