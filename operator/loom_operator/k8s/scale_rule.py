"""Which replica count a role runs on Kubernetes, and where it is written back: the card's
`replicas`, or the role's RoleScale (what `kubectl scale`, an HPA, a KEDA ScaledObject or Loom's
planner writes), clamped by the card's autoscaling bounds.

Pure over plain data; the operator's shell (k8s/scaler.py) reads the objects and writes what
`settle` returns. Never decides a count itself (the planner does) and never touches a pod.

The rule:
- A role the autoscaling section does not name: the card's `replicas` are the truth. A
  RoleScale whose spec.replicas changed since the operator last took it in (its generation is
  ahead of status.observedGeneration) was scaled by someone: that count is written into the
  card, as `kubectl scale deployment` writes a Deployment's replicas. Otherwise the card's count
  is written into the RoleScale (a card edit shows in `kubectl get rolescales`).
- A role the section names: the RoleScale's spec.replicas are the truth, clamped into the
  bounds (a count outside them is written back clamped, and said so); the card's `replicas` is
  only where it starts. The planner (or, with `planner: false`, an HPA or KEDA) moves it.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom_operator.api.roles import RoleName
from loom_operator.fleet.autoscale import AutoscalePolicy

CARD = "Card"
"""The count is the card's `replicas`."""
SCALE_TARGET = "ScaleTarget"
"""Someone scaled the role's RoleScale (kubectl scale, an HPA, KEDA)."""
CLAMPED = "Clamped"
"""The RoleScale asked for a count outside the card's bounds."""


@dataclass(frozen=True)
class ScaleView:
    """A role's RoleScale as the operator read it (None: it does not exist yet)."""

    replicas: int | None
    """spec.replicas (None: never set)."""
    generation: int = 0
    observed_generation: int | None = None
    """status.observedGeneration: the generation the operator last took in."""

    @property
    def scaled_by_someone(self) -> bool:
        """Its spec changed since the operator last took it in."""
        return self.replicas is not None and self.generation != self.observed_generation


@dataclass(frozen=True)
class Settled:
    """One role's count and what to write so that the card and the RoleScale agree."""

    role: RoleName
    desired: int
    """Workers the role runs toward."""
    reason: str
    card_replicas: int | None = None
    """Write this into the card's spec.roles.<role>.replicas (None: leave it)."""
    scale_replicas: int | None = None
    """Write this into the RoleScale's spec.replicas (None: leave it)."""
    message: str = ""
    """An event on the card when someone else's count was taken in or clamped ('' none)."""


def settle(
    role: RoleName, card_replicas: int, scale: ScaleView, policy: AutoscalePolicy | None
) -> Settled:
    """The count of one role and the writes that make the card and its RoleScale agree. Pure."""
    bounded = policy is not None and role in policy.roles
    if not bounded:
        if scale.scaled_by_someone and scale.replicas != card_replicas:
            n = int(scale.replicas or 0)
            msg = (
                f"{role} scaled to {n} through its RoleScale: written into "
                f"spec.roles.{role}.replicas (was {card_replicas})"
            )
            return Settled(role, n, SCALE_TARGET, card_replicas=n, message=msg)
        if scale.replicas != card_replicas:
            return Settled(role, card_replicas, CARD, scale_replicas=card_replicas)
        return Settled(role, card_replicas, CARD)
    assert policy is not None
    asked = card_replicas if scale.replicas is None else scale.replicas
    n = policy.clamp(role, asked)
    if scale.replicas is None:
        return Settled(role, n, CARD, scale_replicas=n)
    if n != asked:
        bounds = policy.roles[role]
        msg = (
            f"{role} asked for {asked} through its RoleScale: clamped to {n} "
            f"(spec.autoscaling.{role}: min {bounds.min}, max {bounds.max})"
        )
        return Settled(role, n, CLAMPED, scale_replicas=n, message=msg)
    if scale.scaled_by_someone:
        msg = f"{role} scaled to {n} through its RoleScale (within spec.autoscaling.{role})"
        return Settled(role, n, SCALE_TARGET, message=msg)
    return Settled(role, n, CARD)
