"""The router admin API's JSON, both ways: what a PUT registers and what a GET lists.

Owns the field names, their types and the PUT body's validation (every problem at once, with
its path); the router serves these documents and the operator's client reads and writes them.
Never does HTTP and never decides what to route where.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from loom_runtime.wire.errors import WireConfigError

EndpointRole = Literal["aggregated", "prefill", "decode"]
ROLES: tuple[EndpointRole, ...] = ("aggregated", "prefill", "decode")
Op = Literal["drain", "undrain", "down", "up", "migrate"]
OPS: tuple[Op, ...] = ("drain", "undrain", "down", "up", "migrate")
ENDPOINTS_PATH = "/admin/endpoints"
_SPEC_FIELDS = frozenset({"url", "role", "weights_version", "kv_events", "kv_replay"})


@dataclass(frozen=True)
class EndpointSpec:
    """What a PUT /admin/endpoints/{id} registers: where the worker is and what it serves."""

    url: str
    role: EndpointRole
    weights_version: str
    kv_events: str | None = None
    """The worker's ZMQ KV-event publisher (tcp://host:port); None: no precise prefix scoring."""
    kv_replay: str | None = None
    """Its replay socket, asked for missed events after a gap."""

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "role": self.role, "weights_version": self.weights_version,
                "kv_events": self.kv_events, "kv_replay": self.kv_replay}  # fmt: skip

    @classmethod
    def from_json(cls, doc: Any, where: str) -> EndpointSpec:
        """Validate a PUT body (or a ROUTER.json entry without its id); WireConfigError lists
        every problem, each with its path under `where`."""
        if not isinstance(doc, Mapping):
            raise WireConfigError(f"{where}: must be an object")
        problems = [f"{where}.{k}: unknown field" for k in sorted(set(doc) - _SPEC_FIELDS)]
        for key in ("url", "role", "weights_version"):
            if not isinstance(doc.get(key), str) or not doc.get(key):
                problems.append(f"{where}.{key}: required, a non-empty string")
        for key in ("kv_events", "kv_replay"):
            if doc.get(key) is not None and not isinstance(doc.get(key), str):
                problems.append(f"{where}.{key}: must be a string or null")
        if isinstance(doc.get("role"), str) and doc["role"] not in ROLES:
            problems.append(f"{where}.role: must be one of {', '.join(ROLES)}")
        url = doc.get("url")
        if isinstance(url, str) and not url.startswith(("http://", "https://")):
            problems.append(f"{where}.url: must start with http:// or https://, got {url!r}")
        if problems:
            raise WireConfigError("; ".join(problems))
        return cls(
            url=str(doc["url"]).rstrip("/"),
            role=doc["role"],
            weights_version=doc["weights_version"],
            kv_events=doc.get("kv_events") or None,
            kv_replay=doc.get("kv_replay") or None,
        )


@dataclass(frozen=True)
class EndpointRecord:
    """One endpoint as the router holds it (an entry of GET /admin/endpoints)."""

    id: str
    spec: EndpointSpec
    ready: bool = True
    draining: bool = False
    down: bool = False
    down_by_router: bool = False
    """Marked down by the router's own probe (it puts it back itself when the probe passes)."""
    in_flight: int = 0
    """Calls the router has in flight to it (including ones the worker has not admitted yet)."""

    @property
    def routed(self) -> bool:
        """Routed as far as the controller decides: not drained, not marked down by the admin
        API. A worker the router's own probe took down is the router's to bring back."""
        return not self.draining and (not self.down or self.down_by_router)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **self.spec.to_json(), "ready": self.ready,
                "draining": self.draining, "down": self.down,
                "down_by_router": self.down_by_router, "in_flight": self.in_flight}  # fmt: skip

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EndpointRecord:
        spec = EndpointSpec(
            url=str(doc["url"]),
            role=cast(EndpointRole, str(doc["role"])),  # the router wrote it from a valid PUT
            weights_version=str(doc.get("weights_version", "")),
            kv_events=doc.get("kv_events"),
            kv_replay=doc.get("kv_replay"),
        )
        return cls(
            id=str(doc["id"]),
            spec=spec,
            ready=bool(doc.get("ready", True)),
            draining=bool(doc.get("draining", False)),
            down=bool(doc.get("down", False)),
            down_by_router=bool(doc.get("down_by_router", False)),
            in_flight=int(doc.get("in_flight", 0)),
        )


def endpoints_json(generation: int, records: list[EndpointRecord]) -> dict[str, Any]:
    """The GET /admin/endpoints body."""
    return {"generation": generation, "endpoints": [r.to_json() for r in records]}


def endpoints_from_json(doc: Any) -> dict[str, EndpointRecord]:
    """The records of a GET /admin/endpoints body, by id."""
    items = doc.get("endpoints", []) if isinstance(doc, Mapping) else doc or []
    return {r.id: r for r in (EndpointRecord.from_json(i) for i in items)}
