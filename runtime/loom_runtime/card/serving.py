"""DeploymentCard serving policy: router, prefix caching, weight sync and failover settings.

Owns these fields, their defaults and ranges, shared by the operator (the DeploymentCard embeds
them) and the router (ROUTER.json carries them); never routes, syncs or fails over anything.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from loom_runtime.card.base import CardModel, cel_rules
from loom_runtime.card.checks import raise_for

SyncStrategyName = Literal["Rolling", "Barrier"]
"""The weight-sync strategies a card may name; each is one module of the operator's
`loom_operator/fleet/strategies/`, registered under this name."""


class Scorers(CardModel):
    """Weights of the router's scorers; each score is in [0, 1] and the weighted sum wins."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.prefixCache + self.queue + self.kvCacheUtilization > 0.0",
                "at least one scorer needs a weight above 0",
            )
        )
    )

    prefix_cache: float = Field(default=3.0, ge=0)
    """Longest cached prefix on the endpoint / prompt blocks."""
    queue: float = Field(default=2.0, ge=0)
    """Fewer waiting requests scores higher."""
    kv_cache_utilization: float = Field(default=2.0, ge=0)
    """More free KV cache scores higher."""

    @model_validator(mode="after")
    def _check(self) -> Scorers:
        if self.prefix_cache + self.queue + self.kv_cache_utilization <= 0:
            msg = "at least one scorer needs a weight above 0, or every endpoint ties"
            raise_for("Scorers", [((), "no_scorer", msg)])
        return self


class Disaggregation(CardModel):
    """When the router sends a prompt to a prefill pod instead of letting decode prefill it."""

    min_uncached_tokens: int = Field(default=2048, ge=0)
    """Prefill remotely only if at least this many prompt tokens miss the decode pod's cache."""


class SessionAffinity(CardModel):
    """Keep a session on one endpoint while it is healthy (its prefix stays cached there)."""

    enabled: bool = True
    """Route requests carrying the header to the endpoint that served the session before."""
    header: str = Field(
        default="x-session-token", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$"
    )
    """HTTP header that names the session."""


class Hotspot(CardModel):
    """Spilling load off an endpoint that every prefix points at (shared system prompts)."""

    spill_margin: float = Field(default=0.2, ge=0, le=1)
    """An endpoint is hot, and loses its prefix and session credit, while its requests exceed
    the candidates' mean × (1 + spillMargin) + 1."""


class Hold(CardModel):
    """Requests the router holds, rather than refuses, while no worker can take them for now: a
    Barrier weight sync, a capacity gap, or a role scaled to zero that is starting a worker."""

    max_requests: int = Field(default=256, ge=0, le=100_000)
    """Held at once; beyond it a request gets 503 with Retry-After at once. 0: hold none."""
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    """Longest hold; then 503 with Retry-After."""


DEFAULT_IN_FLIGHT_PREFIX_S = 10.0
"""One router replica: remember where a prompt went until its KV events arrive (a prefill of a
long prompt under load takes seconds)."""


class Router(CardModel):
    """The endpoint picker and OpenAI proxy in front of the roles."""

    replicas: int = Field(default=1, ge=1)
    """Router pods (active-active)."""
    scorers: Scorers = Field(default_factory=Scorers)
    """Scorer weights (prefixCache 3, queue 2, kvCacheUtilization 2)."""
    prefix_scorer: Literal["precise", "approximate"] = "precise"
    """precise: hash tokens like the engine, fed by KV events | approximate: guess from routing."""
    disaggregation: Disaggregation = Field(default_factory=Disaggregation)
    """When to prefill remotely."""
    session_affinity: SessionAffinity = Field(default_factory=SessionAffinity)
    """Sticky sessions by header."""
    hotspot: Hotspot = Field(default_factory=Hotspot)
    """Load spilling from hot endpoints."""
    hold: Hold = Field(default_factory=Hold)
    """Requests held while capacity is paused or starting (256 at most, 60 s each)."""
    in_flight_prefix_seconds: float | None = Field(default=None, ge=0, le=60)
    """precise: count a prompt's blocks as held by the endpoint it was routed to for this long,
    until its KV events arrive (bursts sharing a new prompt then stay together instead of each
    prefilling it elsewhere). Each replica knows only what it routed itself, so with replicas > 1
    they may decide differently inside this window. 0: off, replicas decide identically from KV
    events alone. Unset: 10 with one replica, 0 with more."""

    @property
    def in_flight_prefix_s(self) -> float:
        """The window in effect: the card's value, or the default for its replica count."""
        if self.in_flight_prefix_seconds is not None:
            return self.in_flight_prefix_seconds
        return DEFAULT_IN_FLIGHT_PREFIX_S if self.replicas == 1 else 0.0


class PrefixCaching(CardModel):
    """How KV blocks are hashed; engines and router use these same values, so they agree."""

    hash_algo: Literal["sha256_cbor"] = "sha256_cbor"
    """SHA-256 over canonical CBOR (vLLM's portable choice)."""
    hash_seed: str = Field(default="0", max_length=64)
    """Seed of the first block's parent hash (vLLM: PYTHONHASHSEED); a string."""


class WeightSync(CardModel):
    """How workers move to new weights: freeze, drain, transfer, bump version, resume."""

    strategy: SyncStrategyName = "Rolling"
    """Rolling keeps serving (a few workers at a time) | Barrier syncs all workers together."""
    max_unavailable: int = Field(default=1, ge=1)
    """Rolling: workers syncing at once (at least 1)."""
    drain_timeout_seconds: int = Field(default=60, ge=0)
    """How long to wait for in-flight requests before migrating the rest."""


class Failover(CardModel):
    """What happens when a worker dies or a KV transfer fails."""

    migration_limit: int = Field(default=3, ge=0)
    """Times one request may be migrated to another worker before it fails."""
    health_timeout_seconds: float = Field(default=5.0, gt=0)
    """A worker that does not answer its health probe for this long is removed from routing."""
    on_transfer_failure: Literal["recompute", "fail"] = "recompute"
    """recompute: decode prefills the prompt itself | fail: the request fails with a 5xx
    naming the failed transfer (502 prefill_failed from the router, 500 kv_transfer_failed
    from a decode worker whose pull failed)."""
