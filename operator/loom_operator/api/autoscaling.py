"""The DeploymentCard's autoscaling section: per-role bounds, the latency and load targets the
planner holds each role to, each worker's profiled capacity, and its stabilisation windows
(docs/autoscaling.md).

Owns these fields, their defaults and ranges; never decides a replica count (the planner,
`loom_operator.fleet.autoscale`, does).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from loom_runtime.card.base import CardModel, cel_rules
from loom_runtime.card.checks import raise_for


class ScaleBounds(CardModel):
    """How far the planner may move one role."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(("self.min <= self.max", "min must not exceed max"))
    )

    min: int = Field(default=1, ge=0)
    """Fewest workers; 0 lets the role idle with none (the router holds its first request)."""
    max: int = Field(ge=1)
    """Most workers."""

    @model_validator(mode="after")
    def _check(self) -> ScaleBounds:
        if self.min > self.max:
            raise_for("ScaleBounds", [(("min",), "min_above_max", "min must not exceed max")])
        return self


class ScaleTargets(CardModel):
    """What the planner holds the roles to; a latency target left unset is not used."""

    ttft_p90_ms: float | None = Field(default=None, gt=0)
    """Prefill (and aggregated): 90th percentile of time to first token, in ms."""
    itl_p90_ms: float | None = Field(default=None, gt=0)
    """Decode (and aggregated): 90th percentile of inter-token latency, in ms."""
    queue: float = Field(default=4.0, gt=0)
    """Requests waiting per worker (queued there, or held by the router for its role)."""
    kv_usage: float = Field(default=0.85, gt=0, le=1)
    """Decode (and aggregated): fraction of KV blocks in use on the fullest worker."""
    prefill_tokens: int | None = Field(default=None, gt=0)
    """Prefill (and aggregated): prompt tokens waiting to be prefilled per worker."""


class ScaleCapacity(CardModel):
    """What one worker of a role serves within the card's latency targets, as profiled for this
    model and hardware (docs/autoscaling.md#capacity). Set, the planner sizes the role from
    its offered load (the needed workers) besides its latency and queue; unset, from those
    alone."""

    prefill_tokens_per_second: float | None = Field(default=None, gt=0)
    """Prefill (and aggregated): prompt tokens one worker prefills per second, saturated."""
    decode_tokens_per_second: float | None = Field(default=None, gt=0)
    """Decode (and aggregated): tokens one worker generates per second within the ITL target
    (its largest batch within the target over that batch's step time)."""
    decode_sequences: float | None = Field(default=None, gt=0)
    """Decode (and aggregated): sequences one worker runs at once within the ITL target."""
    utilization: float = Field(default=0.5, gt=0, le=1)
    """The share of that capacity the planner plans to use (the rest absorbs the load's
    noise between rounds and the time a new worker takes to start)."""


class Autoscaling(CardModel):
    """Loom's planner moves each named role between its bounds (the role's `replicas` is where
    it starts); a role not named keeps its `replicas`."""

    prefill: ScaleBounds | None = None
    decode: ScaleBounds | None = None
    aggregated: ScaleBounds | None = None
    targets: ScaleTargets = Field(default_factory=ScaleTargets)
    capacity: ScaleCapacity = Field(default_factory=ScaleCapacity)
    scale_up_seconds: float = Field(default=30.0, ge=0, le=3600)
    """Growth follows the lowest recommendation of this window (a brief spike adds nothing)."""
    scale_down_seconds: float = Field(default=300.0, ge=0, le=3600)
    """Shrinking follows the highest recommendation of this window (a lull removes nothing)."""
    planner: bool = True
    """false: Loom's planner stays off and something else moves the named roles through their
    RoleScale objects (an HPA, a KEDA ScaledObject, `kubectl scale`); the bounds still clamp
    whatever it asks. `loom up`, which has no such scaler, then keeps the roles' replicas."""
