"""The router's one settings type (`RoutingSettings`): every tunable of routing and failover,
converted once from ROUTER.json (shell/config.py) and never read from a card in hot loops.

Owns defaults that the card does not expose and their ranges; never routes anything itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from loom_router.errors import ConfigError
from loom_runtime.card.serving import DEFAULT_IN_FLIGHT_PREFIX_S

PrefixScorerKind = Literal["precise", "approximate"]
PickerKind = Literal["max", "weighted"]
TransferFailurePolicy = Literal["recompute", "fail"]


@dataclass(frozen=True)
class ScorerWeights:
    """Weight of each scorer, by the scorer's name (core/pipeline.py SCORERS); a scorer with
    weight 0 is not run. Scores are in [0, 1]. A field the card's `router.scorers` has too is
    set from it under the same name (shell/config.py)."""

    prefix_cache: float = 3.0
    queue: float = 2.0
    kv_cache_utilization: float = 2.0
    running: float = 0.0
    """Not in the card (llm-d leaves it off too); queue already covers most of it."""
    in_flight: float = 1.0
    """The router's own count: fresh at every pick, covering the gap between two scrapes."""
    session_affinity: float = 10.0
    """Above the card's default sum (7), so a session stays put unless its endpoint is hot."""

    def __post_init__(self) -> None:
        values = self.as_pairs()
        if any(w < 0 for _, w in values):
            raise ConfigError(f"scorer weights must be >= 0, got {dict(values)}")
        if sum(w for _, w in values) <= 0:
            raise ConfigError("at least one scorer needs a weight above 0")

    def as_pairs(self) -> tuple[tuple[str, float], ...]:
        """(scorer name, weight) in field order, the order scores are summed in."""
        return tuple((f.name, getattr(self, f.name)) for f in fields(self))


@dataclass(frozen=True)
class RoutingSettings:
    """How to route and fail over: everything the pure router core needs (the card's router and
    failover sections plus the engines' hashing); defaults match the card's defaults."""

    weights: ScorerWeights = field(default_factory=ScorerWeights)
    prefix_scorer: PrefixScorerKind = "precise"
    picker: PickerKind = "max"
    min_uncached_tokens: int = 2048
    """P/D: prefill remotely only if at least this many prompt tokens miss decode's cache."""
    session_affinity: bool = True
    session_header: str = "x-session-token"
    spill_margin: float = 0.2
    """Hot-spot rule: hot iff load > mean × (1 + spill_margin) + 1 (see hotspot.py)."""
    block_size: int = 16
    hash_algo: str = "sha256_cbor"
    hash_seed: str = "0"
    migration_limit: int = 3
    """Times one request may move to another worker before the client gets an error."""
    health_timeout_s: float = 5.0
    """Longest wait for a probe or a connection before the worker counts as down."""
    on_transfer_failure: TransferFailurePolicy = "recompute"
    """A failed remote prefill: decode prefills locally (recompute) or the request fails."""
    stale_after_s: float = 2.0
    """A scrape older than this counts as unknown load (llm-d: 2 s)."""
    host_hit_weight: float = 0.5
    """Precise: what a prompt block an endpoint holds only in its host KV tier (KV events with
    medium CPU) counts for in the prefix score, against 1 for a device-resident block: the
    engine reloads it, cheaper than recomputing, dearer than a hit. 0..1."""
    max_index_entries: int = 1_000_000
    """Precise index: (endpoint, block) entries kept in all; about 0.3 KiB each."""
    approx_blocks_per_endpoint: int = 31_250
    """Approximate index: text blocks remembered per endpoint (llm-d's default)."""
    max_sessions: int = 100_000
    in_flight_prefix_s: float = DEFAULT_IN_FLIGHT_PREFIX_S
    """Precise: a routed prompt's blocks count as held by its endpoint for this long, before its
    KV events arrive. Per-replica memory, so replicas may then disagree; 0 turns it off (the
    card's default when it runs more than one router replica)."""
    debug_scores: int = 8
    """Candidates whose score breakdown a RoutingDecision carries (the chosen one first)."""
    max_held: int = 256
    """Requests held at once while no worker can take them for now (card router.hold)."""
    hold_s: float = 60.0
    """Longest hold before a 503 with Retry-After."""
    hold_when_empty: bool = False
    """Also hold while no serving worker exists at all: a role the planner may scale to zero
    (autoscaling min 0) is starting one."""

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be > 0, got {value}"
            for name, value in (
                ("block_size", self.block_size),
                ("stale_after_s", self.stale_after_s),
                ("health_timeout_s", self.health_timeout_s),
                ("max_index_entries", self.max_index_entries),
                ("approx_blocks_per_endpoint", self.approx_blocks_per_endpoint),
                ("max_sessions", self.max_sessions),
                ("debug_scores", self.debug_scores),
                ("hold_s", self.hold_s),
            )
            if value <= 0
        ]
        if self.min_uncached_tokens < 0 or self.migration_limit < 0 or self.max_held < 0:
            problems.append("min_uncached_tokens, migration_limit and max_held must be >= 0")
        if self.in_flight_prefix_s < 0:
            problems.append(f"in_flight_prefix_s must be >= 0, got {self.in_flight_prefix_s}")
        if not 0 <= self.host_hit_weight <= 1:
            problems.append(f"host_hit_weight must be in [0, 1], got {self.host_hit_weight}")
        if not 0 <= self.spill_margin <= 10:
            problems.append(f"spill_margin must be in [0, 10], got {self.spill_margin}")
        if self.prefix_scorer not in ("precise", "approximate"):
            problems.append(f"prefix_scorer must be precise|approximate: {self.prefix_scorer!r}")
        if self.picker not in ("max", "weighted"):
            problems.append(f"picker must be max|weighted, got {self.picker!r}")
        if self.on_transfer_failure not in ("recompute", "fail"):
            problems.append(
                f"on_transfer_failure must be recompute|fail: {self.on_transfer_failure!r}"
            )
        if problems:
            raise ConfigError("router settings: " + "; ".join(problems))
