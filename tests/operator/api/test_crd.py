"""The generated CRDs: up to date in crds/, valid apiextensions v1, structural, usable."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from loom_operator.api import DeploymentCard, crd_files
from loom_operator.api.structural_check import structural_problems
from loom_runtime.card import ModelCard
from loom_runtime.card.load import parse_card, read_documents

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "crds"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
NAMES = ("loom.dev_modelcards.yaml", "loom.dev_deploymentcards.yaml", "loom.dev_rolescales.yaml")


@functools.cache
def _generated() -> dict[str, str]:
    return crd_files()


@functools.cache
def _parsed(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(_generated()[name], Loader=yaml.CSafeLoader)
    return loaded


def _crd(name: str) -> dict[str, Any]:
    """A fresh copy of a generated CRD (tests may change it)."""
    return copy.deepcopy(_parsed(name))


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = _crd(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_crds_directory_matches_the_models_byte_for_byte() -> None:
    generated = _generated()
    assert sorted(generated) == sorted(NAMES)
    on_disk = {p.name: p.read_bytes() for p in CRDS.glob("loom.dev_*.yaml")}
    assert on_disk == {name: text.encode() for name, text in generated.items()}, (
        "crds/ is stale: run `make crds`"
    )


def test_generation_is_deterministic() -> None:
    assert crd_files() == _generated()
    assert all(text.endswith("\n") and not text.endswith("\n\n") for text in _generated().values())


@pytest.mark.parametrize("name", NAMES)
def test_crd_is_a_valid_apiextensions_v1_object(name: str) -> None:
    assert kubernetes_validate.validate(_crd(name), "1.37", strict=True) == "1.37"


def test_apiextensions_validation_catches_a_broken_crd() -> None:
    crd = _crd(NAMES[1])
    version = crd["spec"]["versions"][0]
    version["schema"]["openAPIV3Schema"]["properties"]["spec"]["const"] = 1  # not a CRD keyword
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(crd, "1.37", strict=True)


@pytest.mark.parametrize("name", NAMES)
def test_crd_schema_is_structural(name: str) -> None:
    assert structural_problems(_schema(name)) == []


def test_names_status_and_columns() -> None:
    mc, dc = (_crd(n)["spec"] for n in NAMES[:2])
    assert mc["names"]["shortNames"] == ["mcard"] and dc["names"]["shortNames"] == ["dcard"]
    assert (dc["group"], dc["scope"], dc["names"]["plural"]) == (
        "loom.dev",
        "Namespaced",
        "deploymentcards",
    )
    for spec in (mc, dc):
        version = spec["versions"][0]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in dc["versions"][0]["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Ready"] == ".status.readyRoles"
    assert columns["Version"] == ".status.weightsVersion"
    assert columns["Age"] == ".metadata.creationTimestamp"
    mc_columns = [c["name"] for c in mc["versions"][0]["additionalPrinterColumns"]]
    assert mc_columns == ["Family", "Version", "Age"]


@pytest.mark.parametrize("name", NAMES)
def test_printer_columns_point_at_fields_of_the_schema(name: str) -> None:
    schema = _schema(name)
    for column in _crd(name)["spec"]["versions"][0]["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".metadata."):
            continue
        node = schema
        for part in column["jsonPath"].strip(".").replace("[0]", "").split("."):
            node = node.get("items", node)["properties"][part]
        assert node["type"] == column["type"]


def test_cross_field_rules_are_in_the_schema_as_cel() -> None:
    spec = _schema(NAMES[1])["properties"]["spec"]["properties"]
    roles = spec["roles"]
    rules = [r["rule"] for r in roles["x-kubernetes-validations"]]
    assert "!has(self.prefill) || has(self.decode)" in rules
    par_rules = [
        r["rule"]
        for r in roles["properties"]["prefill"]["properties"]["parallelism"][
            "x-kubernetes-validations"
        ]
    ]
    assert "(self.tp * self.pcp) % self.dcp == 0" in par_rules
    model_spec = _schema(NAMES[0])["properties"]["spec"]
    assert any("assumesLoop" in r["rule"] for r in model_spec["x-kubernetes-validations"])
    assert model_spec["properties"]["components"]["x-kubernetes-list-map-keys"] == ["name"]


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{p.name}:{i}", doc)
        for p in EXAMPLES
        for i, doc in read_documents(p)
        if isinstance(doc, dict)
    ]


@pytest.mark.parametrize(("where", "doc"), _documents(), ids=[w for w, _ in _documents()])
def test_examples_pass_the_crd_schema(where: str, doc: dict[str, Any]) -> None:
    name = NAMES[0] if doc["kind"] == "ModelCard" else NAMES[1]
    # OpenAPI v3.0 bounds (boolean exclusiveMinimum) are JSON Schema draft 4.
    jsonschema.Draft4Validator(_schema(name)).validate(doc)


def _apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """What the API server does with schema defaults before storing an object."""
    if isinstance(value, list) and "items" in node:
        return [_apply_defaults(node["items"], v) for v in value]
    if not isinstance(value, dict) or "properties" not in node:
        return value
    out = dict(value)
    for key, child in node["properties"].items():
        if key not in out and "default" in child:
            out[key] = child["default"]
        if key in out:
            out[key] = _apply_defaults(child, out[key])
    return out


def _kind(doc: dict[str, Any]) -> tuple[type[ModelCard] | type[DeploymentCard], str]:
    return (ModelCard, NAMES[0]) if doc["kind"] == "ModelCard" else (DeploymentCard, NAMES[1])


@pytest.mark.parametrize(("where", "doc"), _documents(), ids=[w for w, _ in _documents()])
def test_server_defaulted_examples_parse_to_the_same_card(where: str, doc: dict[str, Any]) -> None:
    model, name = _kind(doc)
    assert parse_card(model, _apply_defaults(_schema(name), doc)) == parse_card(model, doc)


def test_server_defaults_agree_with_the_models() -> None:
    doc = {
        "apiVersion": "loom.dev/v1alpha1",
        "kind": "DeploymentCard",
        "metadata": {"name": "d"},
        "spec": {
            "modelCard": "m",
            "roles": {"decode": {"engine": {}, "parallelism": {}}},
            "router": {},
            "weightSync": {},
            "failover": {},
        },
    }
    defaulted = _apply_defaults(_schema(NAMES[1]), doc)
    decode = defaulted["spec"]["roles"]["decode"]
    assert decode["replicas"] == 1 and decode["engine"]["blockSize"] == 16
    assert defaulted["spec"]["weightSync"]["maxUnavailable"] == 1
    assert parse_card(DeploymentCard, defaulted) == parse_card(DeploymentCard, doc)


def test_a_role_scale_is_a_scale_target_for_kubectl_an_hpa_and_keda() -> None:
    spec = _crd("loom.dev_rolescales.yaml")["spec"]
    assert (spec["names"]["kind"], spec["names"]["plural"], spec["scope"]) == (
        "RoleScale", "rolescales", "Namespaced",
    )  # fmt: skip
    version = spec["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert schema["spec"]["properties"]["replicas"]["type"] == "integer"
    assert schema["status"]["properties"]["replicas"]["type"] == "integer"
    assert schema["status"]["properties"]["selector"]["type"] == "string"


def test_kubectl_get_deploymentcards_shows_serving_and_desired_per_role() -> None:
    dc = _crd("loom.dev_deploymentcards.yaml")["spec"]["versions"][0]
    columns = {c["name"]: c["jsonPath"] for c in dc["additionalPrinterColumns"]}
    assert columns["Replicas"] == ".status.replicas"
