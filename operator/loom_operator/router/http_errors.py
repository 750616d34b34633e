"""THE mapping of the router's typed errors to HTTP statuses and OpenAI error bodies.

Owns the shell's own error types and the one table both the proxy and the admin API use; never
decides whether something is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loom_operator.router.errors import (
    EndpointError,
    EndpointExistsError,
    NoEndpointError,
    RouterConfigError,
    RouterError,
)
from loom_operator.router.upstream import UpstreamError


class BadRequestError(RouterError):
    """The client's body is not a JSON object, or misses what routing needs (HTTP 400)."""


class UnauthorizedError(RouterError):
    """No valid API key / admin token (HTTP 401)."""


class PrefillFailedError(RouterError):
    """The remote prefill failed and failover.onTransferFailure is `fail` (HTTP 502)."""


class MigrationFailedError(RouterError):
    """A request's worker failed and no other worker could continue it (HTTP 502)."""


@dataclass(frozen=True)
class Reply:
    status: int
    type: str
    code: str | None
    message: str

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": None,
                          "code": self.code}}  # fmt: skip


_INVALID = "invalid_request_error"
_UNAVAILABLE = "service_unavailable_error"
# (error class, status, OpenAI type, code); first match wins, subclasses first.
_TABLE: tuple[tuple[type[BaseException], int, str, str | None], ...] = (
    (UnauthorizedError, 401, "authentication_error", "invalid_api_key"),
    (BadRequestError, 400, _INVALID, None),
    (RouterConfigError, 400, _INVALID, "invalid_endpoint"),
    (EndpointExistsError, 409, _INVALID, "endpoint_exists"),
    (EndpointError, 404, _INVALID, "endpoint_not_found"),
    (NoEndpointError, 503, _UNAVAILABLE, "no_endpoint"),
    (PrefillFailedError, 502, "server_error", "prefill_failed"),
    (MigrationFailedError, 502, "server_error", "migration_failed"),
    (UpstreamError, 502, "server_error", "upstream_failed"),
)


def classify(exc: BaseException, request_id: str | None = None) -> Reply:
    """The reply for `exc`; errors the router did not raise on purpose hide their text."""
    for cls, status, kind, code in _TABLE:
        if isinstance(exc, cls):
            return Reply(status, kind, code, str(exc))
    where = f" (request {request_id})" if request_id else ""
    return Reply(500, "server_error", None, f"internal router error{where}; see the router log")


def http_error_body(message: str) -> dict[str, Any]:
    """The body for protocol-level failures (unknown path, wrong method)."""
    return Reply(400, _INVALID, None, message).body()
