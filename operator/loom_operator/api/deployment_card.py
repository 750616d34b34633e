"""The DeploymentCard: how a ModelCard is served (roles, router, weight sync, failover).

Owns the card's top-level shape; never renders manifests or talks to a cluster.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loom_operator.api.roles import Roles
from loom_operator.api.status import DeploymentCardStatus
from loom_runtime.card.base import API_VERSION, CardModel, DnsName, ObjectMeta
from loom_runtime.card.serving import Failover, PrefixCaching, Router, WeightSync

Backend = Literal["native", "vllm"]


class DeploymentCardSpec(CardModel):
    """How the model is served."""

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
