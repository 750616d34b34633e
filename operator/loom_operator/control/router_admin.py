"""A client of the router's admin API: register, drain, mark down/up, migrate and remove endpoints.

Owns the HTTP calls, the bearer token and a timeout on every call (the JSON is
loom_runtime.wire.router_admin's, the router's too); the only code in the operator that talks to
the router, on either substrate. Never decides what to route where.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from loom_runtime.wire.router_admin import (
    ENDPOINTS_PATH,
    EndpointRecord,
    EndpointSpec,
    Op,
    endpoints_from_json,
)

CALL_TIMEOUT_S = 5.0


class RouterAdminError(Exception):
    """An admin call failed; `status` is the HTTP status (0 when the router was not reached)."""

    def __init__(self, what: str, status: int, detail: str) -> None:
        super().__init__(f"router admin {what}: {status or 'unreachable'}: {detail}")
        self.status = status


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

    async def endpoints(self) -> dict[str, EndpointRecord]:
        return endpoints_from_json(await self._request("GET", ENDPOINTS_PATH))

    async def put(self, endpoint_id: str, spec: EndpointSpec) -> None:
        await self._request("PUT", f"{ENDPOINTS_PATH}/{endpoint_id}", spec.to_json())

    async def delete(self, endpoint_id: str) -> None:
        """Remove the endpoint; one the router does not know is already removed."""
        try:
            await self._request("DELETE", f"{ENDPOINTS_PATH}/{endpoint_id}")
        except RouterAdminError as exc:
            if exc.status != 404:
                raise

    async def op(self, endpoint_id: str, op: Op) -> None:
        await self._request("POST", f"{ENDPOINTS_PATH}/{endpoint_id}/{op}")

    async def held_requests(self, metrics_url: str) -> int:
        """How many requests the router holds for paused capacity (its public /metrics)."""
        what = f"GET {metrics_url}"
        try:
            async with self._client().get(metrics_url) as r:
                text = await r.text()
        except aiohttp.ClientError as exc:
            raise RouterAdminError(what, 0, str(exc) or type(exc).__name__) from None
        except TimeoutError:
            raise RouterAdminError(what, 0, "timed out") from None
        if r.status != 200:
            raise RouterAdminError(what, r.status, text[:300])
        return held_from_metrics(text)


HELD_METRIC = "loom_router:held_requests"


def held_from_metrics(text: str) -> int:
    """The router's held-requests gauge in Prometheus text (0 when it is absent)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == HELD_METRIC:
            try:
                return max(0, int(float(value)))
            except ValueError:
                return 0
    return 0


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
