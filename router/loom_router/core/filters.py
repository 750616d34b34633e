"""Which endpoints may take a request: role, ready, not draining, not down, same weights version.

Owns the rules and the reason each endpoint was dropped; never scores or picks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from loom_router.core.endpoints import Endpoint
from loom_router.core.load import LoadView
from loom_runtime.wire.router_admin import EndpointRole

SERVING_ROLES: frozenset[EndpointRole] = frozenset({"decode", "aggregated"})
"""Roles that can answer a request end to end (decode prefills short prompts itself)."""
PREFILL_ROLES: frozenset[EndpointRole] = frozenset({"prefill"})


@dataclass(frozen=True)
class Rejection:
    endpoint_id: str
    reason: str


@dataclass(frozen=True)
class FilterResult:
    """Endpoints of the wanted roles that passed, and why the others of those roles did not."""

    kept: tuple[Endpoint, ...]
    rejected: tuple[Rejection, ...]


def rejection(
    endpoint: Endpoint,
    load: LoadView,
    weights_version: str | None = None,
    exclude: Collection[str] = (),
) -> str | None:
    """Why `endpoint` may not take the request, or None if it may. The first reason wins.

    `weights_version` pairs a request with one version: a prefill for a decode picked on v
    must be on v, and a migrated request stays on its version. A fresh scrape reporting
    another version than the endpoint record, or admission closed, means the engine is
    mid-sync or shutting down: it is skipped until discovery catches up.
    """
    if endpoint.id in exclude:
        return "excluded by the request (it failed there)"
    if endpoint.down:
        return "marked down"
    if not endpoint.ready:
        return "not ready"
    if endpoint.draining:
        return "draining"
    if weights_version is not None and endpoint.weights_version != weights_version:
        return f"weights version {endpoint.weights_version}, request needs {weights_version}"
    m = load.metrics(endpoint.id)
    if m is not None:
        if m.admission_open is False:
            return "admission closed (engine paused or stopping)"
        if m.weights_version is not None and m.weights_version != endpoint.weights_version:
            return (
                f"engine reports weights version {m.weights_version}, "
                f"discovery says {endpoint.weights_version}"
            )
    return None


def filter_endpoints(
    endpoints: Iterable[Endpoint],
    roles: Collection[EndpointRole],
    load: LoadView,
    weights_version: str | None = None,
    exclude: Collection[str] = (),
) -> FilterResult:
    """The endpoints of `roles` that may take the request, in the given order."""
    kept: list[Endpoint] = []
    rejected: list[Rejection] = []
    for endpoint in endpoints:
        if endpoint.role not in roles:
            continue
        reason = rejection(endpoint, load, weights_version, exclude)
        if reason is None:
            kept.append(endpoint)
        else:
            rejected.append(Rejection(endpoint.id, reason))
    return FilterResult(tuple(kept), tuple(rejected))
