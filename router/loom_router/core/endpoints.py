"""The endpoints the router may send to (`Endpoint`), their snapshots, and where they come from.

Owns endpoint records and the static, admin-driven source; never probes, scrapes or routes.
A Kubernetes pod-watch source implements the same `EndpointSource` protocol.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol

from loom_router.errors import ConfigError, EndpointError, EndpointExistsError
from loom_runtime.wire.router_admin import ROLES, EndpointRole, EndpointSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoint:
    """One engine the router can send to. `id` is stable (pod name); `url` its HTTP base."""

    id: str
    url: str
    role: EndpointRole
    weights_version: str
    ready: bool = True
    draining: bool = False
    """Going away or syncing weights: finishes what it has, takes nothing new."""
    down: bool = False
    """Marked down by an admin or by a failed connection; back only when marked up."""
    kv_events: str | None = None
    """ZMQ PUB address of its KV events (precise prefix scoring), e.g. tcp://10.0.0.5:5557."""
    kv_replay: str | None = None
    """ZMQ ROUTER address that replays KV-event batches from a sequence number."""

    def __post_init__(self) -> None:
        if not self.id or not self.url:
            raise ConfigError(f"an endpoint needs an id and a url, got {self!r}")
        if self.role not in ROLES:
            raise ConfigError(f"endpoint {self.id!r}: role must be one of {ROLES}")

    @classmethod
    def from_spec(cls, endpoint_id: str, spec: EndpointSpec) -> Endpoint:
        return cls(endpoint_id, spec.url, spec.role, spec.weights_version,
                   kv_events=spec.kv_events, kv_replay=spec.kv_replay)  # fmt: skip

    @property
    def spec(self) -> EndpointSpec:
        """Where it is and what it serves, as the admin API writes it."""
        return EndpointSpec(self.url, self.role, self.weights_version, self.kv_events,
                            self.kv_replay)  # fmt: skip

    @property
    def routable(self) -> bool:
        """Ready, not draining and not marked down."""
        return self.ready and not self.draining and not self.down


@dataclass(frozen=True)
class EndpointSnapshot:
    """Every known endpoint at one moment, sorted by id (so every router replica iterates alike).

    `generation` grows by one with each change of the source that made it.
    """

    endpoints: tuple[Endpoint, ...] = ()
    generation: int = 0
    by_id: Mapping[str, Endpoint] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.endpoints, key=lambda e: e.id))
        ids = {e.id for e in ordered}
        if len(ids) != len(ordered):
            raise ConfigError("endpoint ids must be unique within a snapshot")
        object.__setattr__(self, "endpoints", ordered)
        object.__setattr__(self, "by_id", MappingProxyType({e.id: e for e in ordered}))

    def get(self, endpoint_id: str) -> Endpoint | None:
        return self.by_id.get(endpoint_id)

    def __len__(self) -> int:
        return len(self.endpoints)


Listener = Callable[[EndpointSnapshot], object]
"""Called with each new snapshot; its return value is ignored."""


class EndpointSource(Protocol):
    """Where the router learns its endpoints: a snapshot now, and a call on every change."""

    def snapshot(self) -> EndpointSnapshot: ...

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(snapshot)` after every change; returns a function that unsubscribes."""
        ...


class StaticEndpoints:
    """An endpoint list changed at runtime by admin operations (and by tests, `loom up`).

    Thread-safe: an operation swaps in a new immutable snapshot under a lock, then calls the
    listeners in the caller's thread, in subscription order; operations are serialised, so
    listeners see generations in order. An asyncio shell that mutates from its event loop gets
    its listeners called on that loop; a listener that must reach another loop uses
    `event_loop.call_soon_threadsafe`. Listeners must be quick and must not call admin operations. A
    listener that raises is logged and stops neither the others nor the operation.
    """

    def __init__(
        self,
        endpoints: Iterable[Endpoint] = (),
        max_endpoints: int = 4096,
        max_listeners: int = 64,
    ) -> None:
        if max_endpoints <= 0 or max_listeners <= 0:
            raise ConfigError("max_endpoints and max_listeners must be positive")
        self._max_endpoints = max_endpoints
        self._max_listeners = max_listeners
        self._lock = threading.Lock()  # guards the snapshot and the listener list
        self._ops = threading.Lock()  # serialises operations, listener calls included
        self._listeners: list[Listener] = []
        self._snapshot = EndpointSnapshot(tuple(endpoints))
        if len(self._snapshot) > max_endpoints:
            raise ConfigError(f"more than {max_endpoints} endpoints")

    def snapshot(self) -> EndpointSnapshot:
        with self._lock:
            return self._snapshot

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            if len(self._listeners) >= self._max_listeners:
                raise ConfigError(f"at most {self._max_listeners} listeners")
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    # --- admin operations ---------------------------------------------------------------------

    def add(self, endpoint: Endpoint) -> EndpointSnapshot:
        """Add a new endpoint; EndpointExistsError if its id is taken (`update` changes one)."""

        def change(current: dict[str, Endpoint]) -> None:
            if endpoint.id in current:
                raise EndpointExistsError(f"endpoint {endpoint.id!r} exists; update it instead")
            if len(current) >= self._max_endpoints:
                raise ConfigError(
                    f"cannot add {endpoint.id!r}: already {self._max_endpoints} endpoints"
                )
            current[endpoint.id] = endpoint

        return self._apply(change)

    def update(self, endpoint: Endpoint) -> EndpointSnapshot:
        """Replace the endpoint with the same id (new version, readiness, address)."""

        def change(current: dict[str, Endpoint]) -> None:
            self._existing(current, endpoint.id)
            current[endpoint.id] = endpoint

        return self._apply(change)

    def remove(self, endpoint_id: str) -> EndpointSnapshot:
        def change(current: dict[str, Endpoint]) -> None:
            self._existing(current, endpoint_id)
            del current[endpoint_id]

        return self._apply(change)

    def drain(self, endpoint_id: str) -> EndpointSnapshot:
        """Stop sending it new requests; it finishes what it has."""
        return self._set(endpoint_id, lambda e: replace(e, draining=True))

    def undrain(self, endpoint_id: str) -> EndpointSnapshot:
        return self._set(endpoint_id, lambda e: replace(e, draining=False))

    def mark_down(self, endpoint_id: str) -> EndpointSnapshot:
        """Take it out of routing at once (connection refused, failed probe, admin)."""
        return self._set(endpoint_id, lambda e: replace(e, down=True))

    def mark_up(self, endpoint_id: str) -> EndpointSnapshot:
        return self._set(endpoint_id, lambda e: replace(e, down=False))

    def set_ready(self, endpoint_id: str, ready: bool) -> EndpointSnapshot:
        return self._set(endpoint_id, lambda e: replace(e, ready=ready))

    # --- internals ----------------------------------------------------------------------------

    @staticmethod
    def _existing(current: Mapping[str, Endpoint], endpoint_id: str) -> Endpoint:
        found = current.get(endpoint_id)
        if found is None:
            known = ", ".join(sorted(current)[:10]) or "none"
            raise EndpointError(f"no endpoint {endpoint_id!r} (known: {known})")
        return found

    def _set(self, endpoint_id: str, edit: Callable[[Endpoint], Endpoint]) -> EndpointSnapshot:
        def change(current: dict[str, Endpoint]) -> None:
            current[endpoint_id] = edit(self._existing(current, endpoint_id))

        return self._apply(change)

    def _apply(self, change: Callable[[dict[str, Endpoint]], None]) -> EndpointSnapshot:
        with self._ops:
            with self._lock:
                current = dict(self._snapshot.by_id)
                change(current)
                snap = EndpointSnapshot(tuple(current.values()), self._snapshot.generation + 1)
                self._snapshot = snap
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener(snap)
                except Exception:
                    logger.exception(
                        "endpoint listener failed", extra={"generation": snap.generation}
                    )
            return snap
