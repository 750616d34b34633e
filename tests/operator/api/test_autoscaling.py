"""The autoscaling section: defaults, ranges, bounds that make sense, roles that exist — refused
by `loom validate` with the same words the API server's CEL rules use."""

from __future__ import annotations

from typing import Any

import pytest

from loom_operator.api import DeploymentCard
from loom_operator.api.crd import DEPLOYMENT_CARD, crd_manifest
from loom_operator.fleet.autoscale import Capacity
from loom_operator.fleet.desired import autoscale_policy
from loom_runtime.card import CardError
from loom_runtime.card.load import parse_card


def _with(deploy_data: dict[str, Any], autoscaling: dict[str, Any]) -> dict[str, Any]:
    return {**deploy_data, "spec": {**deploy_data["spec"], "autoscaling": autoscaling}}


def _errors(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(CardError) as info:
        parse_card(DeploymentCard, data)
    return {e.path: e.message for e in info.value.errors}


def test_defaults(deploy_data: dict[str, Any]) -> None:
    card = parse_card(DeploymentCard, _with(deploy_data, {"decode": {"max": 4}}))
    a = card.spec.autoscaling
    assert a is not None and a.decode is not None and a.prefill is None
    assert (a.decode.min, a.decode.max) == (1, 4)
    assert (a.scale_up_seconds, a.scale_down_seconds) == (30, 300)
    t = a.targets
    assert (t.ttft_p90_ms, t.itl_p90_ms, t.queue, t.kv_usage, t.prefill_tokens) == (
        None, None, 4.0, 0.85, None,
    )  # fmt: skip
    c = a.capacity  # unknown unless profiled: the latency and queue pressures alone
    assert (c.prefill_tokens_per_second, c.decode_tokens_per_second, c.decode_sequences) == (
        None, None, None,
    )  # fmt: skip
    assert c.utilization == 0.5
    assert parse_card(DeploymentCard, deploy_data).spec.autoscaling is None  # off unless asked


def test_the_capacity_reaches_the_planner_in_its_units(deploy_data: dict[str, Any]) -> None:
    capacity = {"prefillTokensPerSecond": 6800, "decodeTokensPerSecond": 920,
                "decodeSequences": 23, "utilization": 0.6}  # fmt: skip
    section = {"decode": {"max": 4}, "capacity": capacity}
    card = parse_card(DeploymentCard, _with(deploy_data, section))
    assert card.spec.autoscaling is not None
    policy = autoscale_policy(card.spec.autoscaling)
    assert policy.capacity == Capacity(
        prefill_tokens_s=6800, decode_tokens_s=920, decode_sequences=23, utilization=0.6
    )


@pytest.mark.parametrize(
    ("autoscaling", "path", "words"),
    [
        ({"decode": {"min": 3, "max": 2}}, "spec.autoscaling.decode.min", "min must not exceed"),
        ({"decode": {"min": -1, "max": 2}}, "spec.autoscaling.decode.min", "greater than"),
        ({"decode": {"min": 0}}, "spec.autoscaling.decode.max", "required"),
        ({"aggregated": {"max": 2}}, "spec.autoscaling.aggregated", "needs a aggregated role"),
        ({"targets": {"kvUsage": 1.5}}, "spec.autoscaling.targets.kvUsage", "less than"),
        ({"targets": {"ttftP90Ms": 0}}, "spec.autoscaling.targets.ttftP90Ms", "greater than"),
        ({"scaleDownSeconds": -1}, "spec.autoscaling.scaleDownSeconds", "greater than"),
        ({"decode": {"max": 2}, "cooldown": 5}, "spec.autoscaling.cooldown", "not permitted"),
        ({"capacity": {"utilization": 0}}, "spec.autoscaling.capacity.utilization", "greater than"),
        ({"capacity": {"utilization": 1.2}}, "spec.autoscaling.capacity.utilization", "less than"),
        (
            {"capacity": {"decodeSequences": -4}},
            "spec.autoscaling.capacity.decodeSequences",
            "greater than",
        ),
        (
            {"capacity": {"prefillTokensPerSecond": 0}},
            "spec.autoscaling.capacity.prefillTokensPerSecond",
            "greater than",
        ),
    ],
)
def test_bad_sections_are_refused_by_path(
    deploy_data: dict[str, Any], autoscaling: dict[str, Any], path: str, words: str
) -> None:
    errors = _errors(_with(deploy_data, autoscaling))
    assert path in errors and words in errors[path].lower(), errors


def test_the_crd_carries_the_same_rules_for_the_api_server() -> None:
    spec = crd_manifest(DEPLOYMENT_CARD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    section = spec["properties"]["spec"]["properties"]["autoscaling"]
    bounds = section["properties"]["decode"]
    assert {"rule": "self.min <= self.max", "message": "min must not exceed max"} in bounds[
        "x-kubernetes-validations"
    ]
    rules = [v["rule"] for v in spec["properties"]["spec"]["x-kubernetes-validations"]]
    assert (
        "!has(self.autoscaling) || !has(self.autoscaling.prefill) || has(self.roles.prefill)"
        in (rules)
    )
