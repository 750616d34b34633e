"""pvc:// sources in the pods: each claim mounted read-only at one root in every worker (a sync
on the same claim changes no pod template), and a card change the running pods' volumes cannot
follow (another claim) refused with where and what to do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import parse_documents
from loom_operator.k8s.render import render
from loom_operator.k8s.render.model_volumes import claim_change, claims, mounted_claims
from loom_operator.k8s.settings import RenderSettings
from loom_runtime.card.model_card import ModelCard

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
UID = "0b0c6a4e-7a1d-4d7e-9a0b-000000000002"

Validate = Callable[[dict[str, Any]], None]


def tiny_pd(source: str, version: str = "v1") -> list[dict[str, Any]]:
    """examples/tiny-pd.yaml's documents, its model loaded from `source` as `version`."""
    docs = list(yaml.safe_load_all((EXAMPLES / "tiny-pd.yaml").read_text()))
    docs[0]["spec"]["components"][0]["source"]["uri"] = source
    docs[0]["spec"]["components"][0]["weightsVersion"] = version
    return docs


def cards(docs: list[dict[str, Any]]) -> tuple[ModelCard, DeploymentCard]:
    parsed = parse_documents(list(enumerate(docs)), "test")
    return parsed.model_cards[0], parsed.deployment_cards[0]


def rendered(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    manifests = render(*cards(docs), UID, RenderSettings())
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def running(source: str) -> list[dict[str, Any]]:
    """The StatefulSets the operator applied for cards loading `source`."""
    return [m for (kind, _), m in rendered(tiny_pd(source)).items() if kind == "StatefulSet"]


def pvc_volumes(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in pod["volumes"] if "persistentVolumeClaim" in v]


def test_a_pvc_source_mounts_its_claim_read_only_in_every_worker_at_one_root(
    validate_manifest: Validate,
) -> None:
    objs = rendered(tiny_pd("pvc://model-store/tiny/v1"))
    for role in ("prefill", "decode"):
        pod = objs[("StatefulSet", f"tiny-pd-{role}")]["spec"]["template"]["spec"]
        claim = {"claimName": "model-store", "readOnly": True}
        assert pvc_volumes(pod) == [{"name": "model-0", "persistentVolumeClaim": claim}]
        (container,) = pod["containers"]
        mount = {"name": "model-0", "mountPath": "/var/lib/loom/models/model-store",
                 "readOnly": True}  # fmt: skip
        assert mount in container["volumeMounts"]
    router = objs[("Deployment", "tiny-pd-router")]["spec"]["template"]["spec"]
    assert not pvc_volumes(router)
    # The worker's card keeps the pvc:// URI: the runtime resolves it under the mount.
    card = objs[("ConfigMap", "tiny-pd-cards")]["data"]["model-card.yaml"]
    assert "uri: pvc://model-store/tiny/v1" in card
    for manifest in objs.values():
        validate_manifest(manifest)
    plain = rendered(tiny_pd("loom://tiny"))
    assert not pvc_volumes(plain[("StatefulSet", "tiny-pd-decode")]["spec"]["template"]["spec"])


def test_a_sync_to_another_path_on_the_same_claim_touches_only_the_config_map() -> None:
    before = rendered(tiny_pd("pvc://model-store/tiny/v1", "v1"))
    after = rendered(tiny_pd("pvc://model-store/tiny/v2", "v2"))
    assert {k for k in before if before[k] != after[k]} == {("ConfigMap", "tiny-pd-cards")}


@pytest.mark.parametrize(
    ("before", "after", "words"),
    [
        ("pvc://store/v1", "pvc://store/v2", None),  # a sync in place
        ("pvc://store/v1", "pvc://store", None),
        ("loom://tiny", "loom://tiny", None),
        ("pvc://store/v1", "pvc://other/v2",
         "spec.components[0].source.uri 'pvc://other/v2', but the pods of tiny-pd-decode mount "
         "claim store"),
        ("loom://tiny", "pvc://store/v2", "but the pods of tiny-pd-decode mount no claim"),
        ("pvc://store/v1", "loom://tiny", "no source.uri names a claim, but the pods of "
         "tiny-pd-decode mount claim store"),
    ],
)  # fmt: skip
def test_only_a_change_of_claim_is_refused(before: str, after: str, words: str | None) -> None:
    problem = claim_change(*cards(tiny_pd(after)), running(before))
    if words is None:
        assert problem is None
    else:
        assert problem is not None and words in problem
        assert "delete and re-apply DeploymentCard tiny-pd" in problem


def test_no_statefulset_yet_or_only_of_dropped_or_deleted_roles_refuses_nothing() -> None:
    model, deployment = cards(tiny_pd("pvc://other/v2"))
    assert claim_change(model, deployment, []) is None
    old = running("pvc://store/v1")
    dropped = [{**s, "metadata": {**s["metadata"], "name": "tiny-pd-aggregated"}} for s in old]
    assert claim_change(model, deployment, dropped) is None
    going = [{**s, "metadata": {**s["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
             for s in old]  # fmt: skip
    assert claim_change(model, deployment, going) is None


def test_every_claim_of_the_components_is_mounted_once_and_read_back() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "tiny-video.yaml").read_text()))
    comps = docs[0]["spec"]["components"]
    for i, comp in enumerate(comps):
        comp["source"] = {"uri": f"pvc://{'b' if i % 2 else 'a'}/part-{i}"}
    model, _ = cards(docs)
    assert claims(model) == ("a", "b")
    sets = [m for (kind, _), m in rendered(docs).items() if kind == "StatefulSet"]
    assert sets and all(mounted_claims(s) == ("a", "b") for s in sets)
