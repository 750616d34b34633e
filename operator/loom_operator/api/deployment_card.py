"""The DeploymentCard: how a ModelCard is served (roles, router, weight sync, failover,
autoscaling).

Owns the card's top-level shape; never renders manifests or talks to a cluster.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from loom_operator.api.autoscaling import Autoscaling
from loom_operator.api.roles import Roles
from loom_operator.api.status import DeploymentCardStatus
from loom_runtime.card.base import API_VERSION, CardModel, DnsName, ObjectMeta, cel_rules, list_map
from loom_runtime.card.checks import raise_for
from loom_runtime.card.errors import Problem
from loom_runtime.card.serving import Failover, PrefixCaching, Router, WeightSync
from loom_runtime.card.workflow import MAX_WORKFLOWS, Workflow

Backend = Literal["native", "vllm"]


def _scales_a_declared_role(role: str) -> tuple[str, str]:
    return (
        f"!has(self.autoscaling) || !has(self.autoscaling.{role}) || has(self.roles.{role})",
        f"autoscaling.{role} needs a {role} role",
    )


class DeploymentCardSpec(CardModel):
    """How the model is served."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            *(_scales_a_declared_role(r) for r in ("prefill", "decode", "aggregated"))
        )
    )

    model_card: DnsName
    """Name of the ModelCard to serve (same namespace)."""
    backend: Backend = "native"
    """native: role pods run the Loom loop runtime | vllm: they run `vllm serve`."""
    roles: Roles
    """prefill + decode, or aggregated."""
    router: Router = Field(default_factory=Router)
    """The endpoint picker in front of the roles."""
    prefix_caching: PrefixCaching = Field(default_factory=PrefixCaching)
    """Block hashing shared by engines and router."""
    weight_sync: WeightSync = Field(default_factory=WeightSync)
    """How workers move to new weights."""
    failover: Failover = Field(default_factory=Failover)
    """Dead workers and failed transfers."""
    autoscaling: Autoscaling | None = None
    """Loom's planner moves the roles it names between their bounds (unset: replicas are
    fixed; docs/autoscaling.md)."""
    workflows: list[Workflow] = Field(
        default_factory=list, max_length=MAX_WORKFLOWS, json_schema_extra=list_map("name")
    )
    """Servables composed of several cards' requests, served by this card's router
    (docs/composite.md)."""

    @model_validator(mode="after")
    def _check(self) -> DeploymentCardSpec:
        errors: list[Problem] = []
        if self.autoscaling is not None:
            declared = self.roles.present()
            errors += [
                (("autoscaling", r), "undeclared_role", f"autoscaling.{r} needs a {r} role")
                for r in ("prefill", "decode", "aggregated")
                if getattr(self.autoscaling, r) is not None and r not in declared
            ]
        names = [w.name for w in self.workflows]
        errors += [
            (("workflows", i, "name"), "duplicate", f"workflow {name!r} twice")
            for i, name in enumerate(names)
            if name in names[:i]
        ]
        raise_for("DeploymentCardSpec", errors)
        return self


class DeploymentCard(CardModel):
    """A DeploymentCard document (kind DeploymentCard, apiVersion loom.dev/v1alpha1)."""

    api_version: Literal["loom.dev/v1alpha1"] = API_VERSION
    kind: Literal["DeploymentCard"] = "DeploymentCard"
    metadata: ObjectMeta
    spec: DeploymentCardSpec
    status: DeploymentCardStatus | None = None

    @property
    def name(self) -> str:
        """metadata.name."""
        return self.metadata.name
