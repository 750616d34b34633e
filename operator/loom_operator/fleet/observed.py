"""What the fleet is: one `WorkerState` per worker at one moment, and what those workers can serve.

Owns the observation records and the coverage rule; never probes a worker or reads a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from loom_operator.api.roles import RoleName


@dataclass(frozen=True)
class WorkerState:
    """One worker as its substrate last saw it. Times are seconds on the controller's clock."""

    name: str
    role: RoleName
    weights_version: str | None
    """Weights version the worker reports; None while it has not said yet."""
    address: str | None = None
    """Where it serves (host:port); None before it has one."""
    alive: bool = True
    """The process or pod exists (running or starting). False once it exited."""
    ready: bool = True
    """Its health probe passes. A paused or loading worker still answers its probe."""
    in_flight: int = 0
    """Requests it is running or holding."""
    pending_kv_pulls: int = 0
    """Prefill: KV blocks pinned for decode workers that have not pulled them yet."""
    admission_open: bool = True
    """The runtime admits new requests (False: paused or draining)."""
    routed: bool = True
    """The router may send it new requests (False: the endpoint is drained or marked down)."""
    loading: bool = False
    """A LoadWeights call is in progress."""
    restarts: int = 0
    """Times its substrate restarted it (for messages)."""
    started_at: float | None = None
    """When the current process or pod started."""
    last_exit_at: float | None = None
    """When it last exited (crash or stop); newer values mean it exited again."""
    last_seen: float | None = None
    """When its health probe last passed."""

    @property
    def busy(self) -> int:
        """What a drain waits for: in-flight requests plus KV pulls not yet done."""
        return self.in_flight + self.pending_kv_pulls

    @property
    def draining(self) -> bool:
        """Admission closed while requests are still in flight."""
        return not self.admission_open and self.busy > 0

    @property
    def healthy(self) -> bool:
        """Alive and answering its probe."""
        return self.alive and self.ready

    @property
    def routable(self) -> bool:
        """Healthy, admitting, and routed: it takes new requests."""
        return self.healthy and self.admission_open and self.routed

    @property
    def frozen(self) -> bool:
        """Neither routed nor admitting: nothing new reaches it."""
        return not self.routed and not self.admission_open


@dataclass(frozen=True)
class FleetObservation:
    """Every worker the substrate knows of, sorted by name, and the time it looked."""

    workers: tuple[WorkerState, ...]
    now: float
    by_name: Mapping[str, WorkerState] = field(init=False, repr=False, compare=False)
    held_requests: int = 0
    """Requests the router holds for paused capacity (a sync took a role out); 0 if unknown."""

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.workers, key=lambda w: w.name))
        names = [w.name for w in ordered]
        if len(set(names)) != len(names):
            raise ValueError(f"worker names must be unique in an observation, got {names}")
        object.__setattr__(self, "workers", ordered)
        object.__setattr__(self, "by_name", MappingProxyType({w.name: w for w in ordered}))

    def get(self, name: str) -> WorkerState | None:
        """The worker called `name`, or None if the substrate does not know it."""
        return self.by_name.get(name)


class Coverage(enum.IntEnum):
    """What a set of routable workers can serve, worst first (so `min` and `<` compare)."""

    NONE = 0
    """Nothing: no request can be served."""
    FALLBACK = 1
    """Decode workers only (or none sharing a version with a prefill): they prefill prompts
    themselves, like aggregated workers. Served, slower."""
    PAIRED = 2
    """Disaggregated: a prefill and a decode worker on one weights version. Aggregated or
    decode-only fleets: any routable worker."""


def coverage(routable: Iterable[WorkerState], disaggregated: bool) -> Coverage:
    """What `routable` can serve without a request ever seeing two weights versions."""
    prefill: set[str | None] = set()
    serving: set[str | None] = set()
    for w in routable:
        if w.role == "prefill":
            prefill.add(w.weights_version)
        else:
            serving.add(w.weights_version)
    if not serving:
        return Coverage.NONE
    if not disaggregated or (prefill & serving) - {None}:
        return Coverage.PAIRED
    return Coverage.FALLBACK
