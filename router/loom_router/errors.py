"""Every typed error of the router, and THE one table that maps each to an HTTP status and body.

Owns the types and that mapping (the proxy and the admin API both use it); never decides whether
something is an error: raising sites say what was wrong, where, and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class RouterError(Exception):
    """Base of every error the router raises on purpose."""


class ConfigError(RouterError, ValueError):
    """What the router is configured with is wrong: ROUTER.json, a RoutingSettings value, an
    endpoint (from the file or the admin API) or a bound of an index or table. Out of range
    there is a bug in the caller or a card the API let through; from the admin API, HTTP 400."""


class EndpointError(RouterError, KeyError):
    """An admin operation names an endpoint that does not exist (HTTP 404).

    Subclasses KeyError for callers that treat it as a lookup miss; `str()` is the message.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class EndpointExistsError(EndpointError):
    """An endpoint is added under an id that is taken (HTTP 409)."""


class NoEndpointError(RouterError):
    """No endpoint can take the request now (HTTP 503); the message lists why each was dropped."""


class CapacityWaitError(NoEndpointError):
    """A request held for capacity (a sync, a gap, a role starting from zero) was not placed:
    the hold is full or its time ran out (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class MetricsParseError(RouterError, ValueError):
    """A /metrics scrape is not Prometheus text; the endpoint's load counts as unknown."""


class KVEventDecodeError(RouterError, ValueError):
    """A KV-event message is not vLLM's wire format; the batch is dropped and counted."""


class UpstreamError(RouterError):
    """A call to a worker failed; `endpoint_id` says which."""

    def __init__(self, endpoint_id: str, message: str) -> None:
        super().__init__(f"worker {endpoint_id}: {message}")
        self.endpoint_id = endpoint_id


class UpstreamUnavailableError(UpstreamError):
    """No answer began (connect failed, stale connection, timeout before headers): nothing was
    done that a client saw, so the request may go elsewhere."""


class UpstreamRefusedError(UpstreamUnavailableError):
    """The worker refused the connection or its address does not answer: it is down."""


class UpstreamBrokenError(UpstreamError):
    """The answer began and then broke (worker died, stalled past the read timeout, or the
    stream ended without [DONE]): the request must be migrated."""


class BadRequestError(RouterError):
    """The client's body is not a JSON object, or misses what routing needs (HTTP 400);
    `param` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class JobNotFoundError(RouterError):
    """A video job id the router does not know (never made here, deleted, or expired): 404."""


class ResponseNotFoundError(RouterError):
    """A stored response (/v1/responses) the router cannot reach: unknown here, or its worker
    left (HTTP 404)."""


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
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra response headers (Retry-After on a 503 the client should retry)."""

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}  # fmt: skip


_INVALID = "invalid_request_error"
_UNAVAILABLE = "service_unavailable_error"
# (error class, status, OpenAI type, code); first match wins, subclasses first.
_TABLE: tuple[tuple[type[BaseException], int, str, str | None], ...] = (
    (UnauthorizedError, 401, "authentication_error", "invalid_api_key"),
    (BadRequestError, 400, _INVALID, None),
    (ConfigError, 400, _INVALID, "invalid_endpoint"),
    (EndpointExistsError, 409, _INVALID, "endpoint_exists"),
    (EndpointError, 404, _INVALID, "endpoint_not_found"),
    (JobNotFoundError, 404, _INVALID, "job_not_found"),
    (ResponseNotFoundError, 404, _INVALID, "response_not_found"),
    (NoEndpointError, 503, _UNAVAILABLE, "no_endpoint"),
    (PrefillFailedError, 502, "server_error", "prefill_failed"),
    (MigrationFailedError, 502, "server_error", "migration_failed"),
    (UpstreamError, 502, "server_error", "upstream_failed"),
)


def classify(exc: BaseException, request_id: str | None = None) -> Reply:
    """The reply for `exc`; errors the router did not raise on purpose hide their text."""
    for cls, status, kind, code in _TABLE:
        if isinstance(exc, cls):
            param = exc.param if isinstance(exc, BadRequestError) else None
            wait = exc.retry_after_s if isinstance(exc, CapacityWaitError) else None
            headers = {} if wait is None else {"Retry-After": str(wait)}
            return Reply(status, kind, code, str(exc), param, headers)
    where = f" (request {request_id})" if request_id else ""
    return Reply(500, "server_error", None, f"internal router error{where}; see the router log")


def http_error_body(message: str) -> dict[str, Any]:
    """The body for protocol-level failures (unknown path, wrong method)."""
    return Reply(400, _INVALID, None, message).body()
