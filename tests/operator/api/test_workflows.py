"""A DeploymentCard's workflows: the shape rules (each wrong case one error with its path and
code, the same rules the CRD's CEL checks) and the rules against the served model."""

from __future__ import annotations

from typing import Any

import pytest

from loom_operator.api import DeploymentCard
from loom_operator.api.compatibility import compatibility_problems, served_routes
from loom_runtime.card import CardError, ModelCard
from loom_runtime.card.load import parse_card

THINK = {"name": "think", "deploymentCard": "mot", "route": "images"}


def _flow(*stages: dict[str, Any], name: str = "story") -> dict[str, Any]:
    return {"name": name, "stages": list(stages)}


def _with(deploy_data: dict[str, Any], *flows: dict[str, Any]) -> dict[str, Any]:
    deploy_data["spec"]["workflows"] = list(flows)
    return deploy_data


def _codes(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(CardError) as info:
        parse_card(DeploymentCard, data)
    return {e.path: e.code for e in info.value.errors}


def test_a_workflow_names_its_stages_cards_and_routes(deploy_data: dict[str, Any]) -> None:
    data = _with(deploy_data, _flow(THINK, {"name": "animate", "route": "videos"}))
    flow = parse_card(DeploymentCard, data).spec.workflows[0]
    assert (flow.name, flow.route, flow.cards()) == ("story", "videos", ("mot",))
    assert [s.deployment_card for s in flow.stages] == ["mot", None]


@pytest.mark.parametrize(
    ("stages", "path", "code"),
    [
        ([THINK, {**THINK, "name": "two"}], "spec.workflows[0].stages[1].deploymentCard",
         "last_stage_here"),
        ([{**THINK, "route": "videos"}, {"name": "b", "route": "images"}],
         "spec.workflows[0].stages[0].route", "feeds_text"),
        ([THINK, {"name": "think", "route": "images"}], "spec.workflows[0].stages[1].name",
         "duplicate"),
        ([{"name": "alone", "route": "images"}], "spec.workflows[0].stages", "too_short"),
        ([THINK, {"name": "b", "route": "audio"}], "spec.workflows[0].stages[1].route",
         "literal_error"),
    ],
)  # fmt: skip
def test_a_wrong_workflow_is_one_error_at_its_path(
    deploy_data: dict[str, Any], stages: list[dict[str, Any]], path: str, code: str
) -> None:
    assert _codes(_with(deploy_data, _flow(*stages))) == {path: code}


def test_two_workflows_of_one_name_are_refused(deploy_data: dict[str, Any]) -> None:
    flow = _flow(THINK, {"name": "b", "route": "images"})
    assert _codes(_with(deploy_data, flow, flow)) == {"spec.workflows[1].name": "duplicate"}


def _model(model_data: dict[str, Any], kind: str) -> ModelCard:
    if kind == "diffusion":
        model_data["spec"]["family"] = "dit"
        model_data["spec"]["loops"][0].update(kind="diffusion", steps=4)
    return parse_card(ModelCard, model_data)


def test_the_last_stage_runs_a_route_the_served_model_serves(
    model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    text = _model(model_data, "text")
    assert served_routes(text) == frozenset()
    data = _with(deploy_data, _flow(THINK, {"name": "animate", "route": "videos"}, name="tiny"))
    deploy = parse_card(DeploymentCard, data)
    found = {(".".join(map(str, p)), code) for p, code, _ in compatibility_problems(deploy, text)}
    assert found == {
        ("spec.workflows.0.name", "workflow_named_like_model"),
        ("spec.workflows.0.stages.1.route", "workflow_route_not_served"),
    }


def test_a_diffusion_model_serves_both_routes(model_data: dict[str, Any]) -> None:
    assert served_routes(_model(model_data, "diffusion")) == frozenset({"images", "videos"})
