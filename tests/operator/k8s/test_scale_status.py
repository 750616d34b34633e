"""What the operator writes about scaling: a RoleScale's status (the scale subresource's
replicas and selector), the card's Autoscaling condition, and who owns a StatefulSet's replicas."""

from __future__ import annotations

import jsonschema

from loom_operator.api.crd import DEPLOYMENT_CARD, ROLE_SCALE, crd_manifest
from loom_operator.api.status import DeploymentCardStatus
from loom_operator.fleet.autoscale import AutoscalePlan, RoleDecision
from loom_operator.k8s.render.role_scale import pod_selector
from loom_operator.k8s.scale_status import autoscaling_condition, owns_replicas, role_scale_status


def test_role_scale_status_carries_the_selector_an_hpa_lists_pods_with() -> None:
    status = role_scale_status(2, 3, pod_selector("tiny-pd", "decode"), 7, "QueueAboveTarget")
    assert status == {
        "replicas": 2, "desiredReplicas": 3, "reason": "QueueAboveTarget",
        "selector": "loom.dev/deployment=tiny-pd,loom.dev/role=decode", "observedGeneration": 7,
    }  # fmt: skip
    assert "observedGeneration" not in role_scale_status(0, 1, "x=y", None, "Card")


def test_the_condition_leads_with_the_change_and_says_every_role() -> None:
    plan = AutoscalePlan(
        (RoleDecision("prefill", 1, 1, "AtTarget", "TTFT p90 90 ms, target 100 ms", 1),
         RoleDecision("decode", 1, 2, "QueueAboveTarget", "9 waiting on 1 worker(s)", 3)),
        {},
    )  # fmt: skip
    c = autoscaling_condition(plan, 4)
    assert (c["type"], c["status"], c["reason"], c["observedGeneration"]) == (
        "Autoscaling", "True", "QueueAboveTarget", 4,
    )  # fmt: skip
    assert "decode 1 → 2 (QueueAboveTarget" in c["message"]
    assert "prefill 1 (AtTarget" in c["message"]
    steady = AutoscalePlan((RoleDecision("decode", 2, 2, "StabilisingDown", "m", 1),), {})
    assert autoscaling_condition(steady, 1)["reason"] == "StabilisingDown"


def test_owns_replicas_reads_the_server_side_apply_owners() -> None:
    sts = {"metadata": {"managedFields": [
        {"manager": "loom-operator", "operation": "Apply",
         "fieldsV1": {"f:spec": {"f:template": {}}}},
        {"manager": "loom-operator-scale", "operation": "Apply",
         "fieldsV1": {"f:spec": {"f:replicas": {}}}},
    ]}}  # fmt: skip
    assert owns_replicas(sts, "loom-operator-scale")
    assert not owns_replicas(sts, "loom-operator")
    assert not owns_replicas({"metadata": {}}, "loom-operator-scale")
    updated = {"metadata": {"managedFields": [
        {"manager": "loom-operator-scale", "operation": "Update",
         "fieldsV1": {"f:spec": {"f:replicas": {}}}},
    ]}}  # fmt: skip
    assert not owns_replicas(updated, "loom-operator-scale")  # only an apply survives a re-render


def test_the_autoscaling_condition_is_in_the_card_status_vocabulary() -> None:
    plan = AutoscalePlan((RoleDecision("decode", 1, 2, "QueueAboveTarget", "m", 2),), {})
    cond = autoscaling_condition(plan, 3) | {"lastTransitionTime": "2026-01-01T00:00:00Z"}
    written = {"conditions": [cond], "replicas": "decode 1/2"}
    status = DeploymentCardStatus.model_validate(written)
    assert status.conditions[0].type == "Autoscaling"
    schema = crd_manifest(DEPLOYMENT_CARD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(written, schema["properties"]["status"])  # what the API server checks
    scale = crd_manifest(ROLE_SCALE)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    mine = role_scale_status(1, 2, pod_selector("tiny-pd", "decode"), 4, "QueueAboveTarget")
    jsonschema.validate(mine, scale["properties"]["status"])
