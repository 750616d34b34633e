"""A client of the router's admin API: register, drain, mark down/up, migrate and remove endpoints.

Owns the admin routes, the bearer token and a timeout on every call; the only code in
`loom_operator.local` that talks to the router. Never decides what to route where.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

Op = Literal["drain", "undrain", "down", "up", "migrate"]
CALL_TIMEOUT_S = 5.0


class RouterAdminError(Exception):
    """An admin call failed; `status` is the HTTP status (0 when the router was not reached)."""

    def __init__(self, what: str, status: int, detail: str) -> None:
        super().__init__(f"router admin {what}: {status or 'unreachable'}: {detail}")
        self.status = status


@dataclass(frozen=True)
class RouterEndpoint:
    """One endpoint as the router holds it."""

    id: str
    url: str
    role: str
    weights_version: str
    draining: bool = False
    down: bool = False
    kv_events: str | None = None
    kv_replay: str | None = None
    down_by_router: bool = False
    """Marked down by the router's own probe (it puts it back itself when the probe passes)."""
    in_flight: int = 0
    """Calls the router has in flight to it (including ones the worker has not admitted yet)."""

    @property
    def routed(self) -> bool:
        """Routed as far as the controller decides: not drained, not marked down by the admin
        API. A worker the router's own probe took down is the router's to bring back."""
        return not self.draining and (not self.down or self.down_by_router)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RouterEndpoint:
        return cls(
            id=str(doc["id"]),
            url=str(doc["url"]),
            role=str(doc["role"]),
            weights_version=str(doc.get("weights_version", "")),
            draining=bool(doc.get("draining", False)),
            down=bool(doc.get("down", False)),
            kv_events=doc.get("kv_events"),
            kv_replay=doc.get("kv_replay"),
            down_by_router=bool(doc.get("down_by_router", False)),
            in_flight=int(doc.get("in_flight", 0)),
        )


@dataclass(frozen=True)
class EndpointSpec:
    """What a PUT registers: where the worker is and what it serves."""

    url: str
    role: str
    weights_version: str
    kv_events: str | None
    kv_replay: str | None

    def matches(self, e: RouterEndpoint) -> bool:
        return (e.url, e.role, e.weights_version, e.kv_events, e.kv_replay) == (
            self.url,
            self.role,
            self.weights_version,
            self.kv_events,
            self.kv_replay,
        )


class RouterAdmin:
    """Admin calls to one router at `base_url` (http://127.0.0.1:ADMIN_PORT)."""

    def __init__(self, base_url: str, token: str, timeout: float = CALL_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        what = f"{method} {path}"
        try:
            async with self._client().request(method, self.base_url + path, json=body) as r:
                text = await r.text()
                if r.status >= 400:
                    raise RouterAdminError(what, r.status, text[:300])
                return None if not text else _json(text)
        except aiohttp.ClientError as exc:
            raise RouterAdminError(what, 0, str(exc) or type(exc).__name__) from None
        except TimeoutError:
            raise RouterAdminError(what, 0, "timed out") from None

    async def endpoints(self) -> dict[str, RouterEndpoint]:
        doc = await self._request("GET", "/admin/endpoints")
        items = doc.get("endpoints", []) if isinstance(doc, dict) else doc or []
        return {e.id: e for e in (RouterEndpoint.from_json(i) for i in items)}

    async def put(self, endpoint_id: str, spec: EndpointSpec) -> None:
        body = {
            "url": spec.url,
            "role": spec.role,
            "weights_version": spec.weights_version,
            "kv_events": spec.kv_events,
            "kv_replay": spec.kv_replay,
        }
        await self._request("PUT", f"/admin/endpoints/{endpoint_id}", body)

    async def delete(self, endpoint_id: str) -> None:
        """Remove the endpoint; one the router does not know is already removed."""
        try:
            await self._request("DELETE", f"/admin/endpoints/{endpoint_id}")
        except RouterAdminError as exc:
            if exc.status != 404:
                raise

    async def op(self, endpoint_id: str, op: Op) -> None:
        await self._request("POST", f"/admin/endpoints/{endpoint_id}/{op}")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
