"""DesiredFleet comes from the cards once: slots, target weights, sync and failover limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loom_operator.api.autoscaling import Autoscaling
from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import load_documents
from loom_operator.fleet.autoscale import RoleBounds
from loom_operator.fleet.desired import (
    DesiredFleet,
    FailoverPolicy,
    FleetError,
    RoleTarget,
    desired_fleet,
    served_component,
    worker_name,
)
from loom_runtime.card.model_card import ModelCard

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _cards(path: Path) -> tuple[ModelCard, DeploymentCard]:
    cards = load_documents(path)
    return cards.model_cards[0], cards.deployment_cards[0]


def _model(components: list[dict[str, Any]], loop_components: list[str]) -> ModelCard:
    return ModelCard.model_validate(
        {
            "apiVersion": "loom.dev/v1alpha1",
            "kind": "ModelCard",
            "metadata": {"name": "m"},
            "spec": {
                "family": "llama",
                "components": components,
                "loops": [{"name": "gen", "kind": "ar_decode", "components": loop_components}],
                "recipe": {"method": "base", "assumesLoop": "gen", "assumesPrecision": "bf16"},
            },
        }
    )


def test_example_pd_card_becomes_a_fleet_with_stable_worker_names() -> None:
    model, deployment = _cards(EXAMPLES / "tiny-pd.yaml")
    d = desired_fleet(model, deployment)
    assert d.deployment == "tiny-pd"
    assert (d.component, d.weights_version, d.source_uri) == ("decoder", "v1", "loom://tiny")
    assert [(s.name, s.role) for s in d.slots] == [
        ("tiny-pd-prefill-0", "prefill"),
        ("tiny-pd-decode-0", "decode"),
    ]
    assert d.disaggregated
    assert d.sync.strategy == "Rolling" and d.sync.max_unavailable == 1
    assert d.sync.drain_timeout_s == 60.0
    assert d.failover.health_timeout_s == 5.0 and d.failover.migration_limit == 3


def test_card_limits_override_policy_and_backoff_comes_from_the_policy() -> None:
    model, deployment = _cards(EXAMPLES / "tiny-aggregated.yaml")
    spec = deployment.spec.model_copy(
        update={
            "weight_sync": deployment.spec.weight_sync.model_copy(
                update={"strategy": "Barrier", "max_unavailable": 3, "drain_timeout_seconds": 7}
            ),
            "failover": deployment.spec.failover.model_copy(update={"health_timeout_seconds": 9.5}),
        }
    )
    deployment = deployment.model_copy(update={"spec": spec})
    d = desired_fleet(model, deployment, FailoverPolicy(health_timeout_s=1, backoff_cap_s=30))
    assert (d.sync.strategy, d.sync.max_unavailable, d.sync.drain_timeout_s) == ("Barrier", 3, 7)
    assert d.failover.health_timeout_s == 9.5  # the card's, not the policy's
    assert d.failover.backoff_cap_s == 30  # the policy's: the card has no such field
    assert not d.disaggregated
    assert [s.name for s in d.slots] == ["tiny-aggregated-aggregated-0"]


def test_a_deployment_of_another_model_is_refused_with_both_names() -> None:
    model, deployment = _cards(EXAMPLES / "tiny-pd.yaml")
    other = model.model_copy(update={"metadata": model.metadata.model_copy(update={"name": "x"})})
    with pytest.raises(FleetError, match=r"serves ModelCard 'tiny', not 'x'"):
        desired_fleet(other, deployment)


@pytest.mark.parametrize(
    ("components", "loop", "served"),
    [
        (
            [
                {"name": "draft", "kind": "draft", "source": {"uri": "loom://tiny"}},
                {"name": "decoder", "kind": "transformer", "source": {"uri": "hf://o/m"}},
            ],
            ["draft", "decoder"],
            "decoder",
        ),
        (
            [{"name": "enc", "kind": "encoder", "source": {"uri": "loom://tiny"}}],
            ["enc"],
            "enc",
        ),
        (
            [
                {"name": "a", "kind": "transformer", "source": {"uri": "loom://tiny"}},
                {"name": "b", "kind": "transformer", "source": {"uri": "loom://tiny"}},
            ],
            ["b"],
            "b",
        ),
    ],
)
def test_served_component_is_the_assumed_loops_transformer(
    components: list[dict[str, Any]], loop: list[str], served: str
) -> None:
    assert served_component(_model(components, loop)).name == served


def test_slots_interleave_roles_by_index() -> None:
    d = DesiredFleet(
        "d", "c", "v1", "loom://tiny", (RoleTarget("decode", 3), RoleTarget("prefill", 2))
    )
    assert [s.name for s in d.slots] == [
        "d-prefill-0",
        "d-decode-0",
        "d-prefill-1",
        "d-decode-1",
        "d-decode-2",
    ]
    assert d.slot("d-decode-2") is not None and d.slot("d-decode-3") is None
    assert d.replicas("decode") == 3 and d.replicas("aggregated") == 0
    assert worker_name("d", "prefill", 4) == "d-prefill-4"


@pytest.mark.parametrize(
    ("roles", "error"),
    [
        ((RoleTarget("aggregated", 1), RoleTarget("decode", 1)), "aggregated excludes"),
        ((RoleTarget("prefill", 1),), "requires a decode role"),
        ((RoleTarget("decode", 1), RoleTarget("decode", 2)), "listed twice"),
    ],
)
def test_impossible_fleets_are_refused(roles: tuple[RoleTarget, ...], error: str) -> None:
    with pytest.raises(FleetError, match=error):
        DesiredFleet("d", "c", "v1", "loom://tiny", roles)


def test_the_autoscaling_section_becomes_the_planners_policy_in_seconds() -> None:
    model, deployment = _cards(EXAMPLES / "tiny-pd.yaml")
    assert desired_fleet(model, deployment).autoscale is None
    section = Autoscaling.model_validate(
        {"decode": {"min": 0, "max": 3}, "targets": {"ttftP90Ms": 800, "itlP90Ms": 40},
         "scaleDownSeconds": 120}
    )  # fmt: skip
    spec = deployment.spec.model_copy(update={"autoscaling": section})
    d = desired_fleet(model, deployment.model_copy(update={"spec": spec}))
    assert d.autoscale is not None
    assert dict(d.autoscale.roles) == {"decode": RoleBounds(0, 3)}
    t = d.autoscale.targets
    assert (t.ttft_p90_s, t.itl_p90_s, t.queue, t.prefill_tokens) == (0.8, 0.04, 4.0, None)
    assert (d.autoscale.scale_up_s, d.autoscale.scale_down_s) == (30.0, 120.0)
    scaled = d.with_replicas({"decode": 3})
    assert [s.name for s in scaled.slots if s.role == "decode"] == [
        "tiny-pd-decode-0", "tiny-pd-decode-1", "tiny-pd-decode-2",
    ]  # fmt: skip
    assert scaled.replicas("prefill") == d.replicas("prefill")
