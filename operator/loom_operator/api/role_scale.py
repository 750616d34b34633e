"""RoleScale: one role of one DeploymentCard as a `/scale` target (kubectl scale, an
autoscaling/v2 HorizontalPodAutoscaler, a KEDA ScaledObject), owned by the operator.

Owns the object's fields; never decides which count wins (k8s/role_scale.py does).
"""

from __future__ import annotations

from pydantic import Field

from loom_operator.api.roles import RoleName
from loom_runtime.card.base import CardModel, DnsName


class RoleScaleSpec(CardModel):
    """Which role this object scales, and the count asked of it."""

    deployment_card: DnsName
    """The DeploymentCard whose role this is (same namespace; the operator sets it)."""
    role: RoleName
    """prefill, decode or aggregated."""
    replicas: int | None = Field(default=None, ge=0)
    """Workers asked of the role (the scale subresource's spec.replicas). Without an autoscaling
    section for the role it mirrors the card's `replicas` (a change here is written into the
    card); with one, the card's bounds clamp it."""


class RoleScaleStatus(CardModel):
    """What runs (the scale subresource's status.replicas and selector)."""

    replicas: int = Field(default=0, ge=0)
    """Workers of the role that serve (ready and routed)."""
    desired_replicas: int = Field(default=0, ge=0)
    """Workers the role runs toward, after the card's bounds."""
    selector: str = ""
    """The label selector of the role's pods, e.g.
    `loom.dev/deployment=tiny-pd,loom.dev/role=decode` (what an HPA lists for pod metrics)."""
    observed_generation: int | None = Field(default=None, ge=0)
    """metadata.generation whose spec.replicas the operator has taken in."""
    reason: str = ""
    """Who decided the desired count last: Card, ScaleTarget, Clamped, or the planner's reason."""
