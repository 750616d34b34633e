"""THE mapping of typed errors to HTTP status + OpenAI error object, and to gRPC status.

Owns status codes and the error body shape; never decides whether something is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from loom_runtime.card.errors import CardError
from loom_runtime.errors import (
    AdmissionError,
    CheckpointError,
    InvalidRequestError,
    LoomError,
    ModelNotFoundError,
    TransferError,
    WorkerLostError,
)


class RequestAbortedError(LoomError):
    """The worker aborted a running request (pause with mode=abort, shutdown); retry elsewhere."""


class EngineStalledError(LoomError):
    """The engine produced no output for a request within the server's stall timeout."""


class ControlStateError(LoomError):
    """A control call arrived in a state that forbids it (load weights before a drained pause)."""


class JobNotFoundError(LoomError):
    """No video job has this id (never created, deleted, or expired past its TTL)."""


class ResponseNotFoundError(LoomError):
    """No stored response has this id (never stored, stored elsewhere, or evicted)."""


class JobNotReadyError(LoomError):
    """A video job's content was asked for before the job completed."""


class UnauthenticatedError(LoomError):
    """A control call came without the shared token, or with a wrong one."""


@dataclass(frozen=True)
class ErrorReply:
    """How one error is told to a client, on either protocol."""

    http_status: int
    type: str
    code: str | None
    grpc_code: grpc.StatusCode
    message: str
    param: str | None = None

    def body(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


_G = grpc.StatusCode
_INVALID = "invalid_request_error"
_UNAVAILABLE = "service_unavailable_error"

# (error class, http status, OpenAI type, code, gRPC code); first match wins, subclasses first.
_TABLE: tuple[tuple[type[BaseException], int, str, str | None, grpc.StatusCode], ...] = (
    (UnauthenticatedError, 401, "authentication_error", "unauthenticated", _G.UNAUTHENTICATED),
    (InvalidRequestError, 400, _INVALID, None, _G.INVALID_ARGUMENT),
    (ModelNotFoundError, 404, _INVALID, "model_not_found", _G.NOT_FOUND),
    (JobNotFoundError, 404, _INVALID, "video_not_found", _G.NOT_FOUND),
    (ResponseNotFoundError, 404, _INVALID, "response_not_found", _G.NOT_FOUND),
    (JobNotReadyError, 409, _INVALID, "video_not_ready", _G.FAILED_PRECONDITION),
    (CardError, 400, _INVALID, "invalid_card", _G.INVALID_ARGUMENT),
    (CheckpointError, 400, _INVALID, "invalid_checkpoint", _G.INVALID_ARGUMENT),
    (ControlStateError, 409, _INVALID, "wrong_state", _G.FAILED_PRECONDITION),
    (AdmissionError, 503, _UNAVAILABLE, "admission_closed", _G.UNAVAILABLE),
    (WorkerLostError, 503, _UNAVAILABLE, "worker_lost", _G.UNAVAILABLE),
    (RequestAbortedError, 503, _UNAVAILABLE, "request_aborted", _G.ABORTED),
    (EngineStalledError, 504, "server_error", "engine_stalled", _G.DEADLINE_EXCEEDED),
    (TransferError, 500, "server_error", "kv_transfer_failed", _G.INTERNAL),
    (LoomError, 500, "server_error", None, _G.INTERNAL),
)


def classify(exc: BaseException, request_id: str | None = None) -> ErrorReply:
    """The reply for `exc`. Errors Loom did not raise on purpose hide their text from clients."""
    for cls, status, kind, code, grpc_code in _TABLE:
        if isinstance(exc, cls):
            param = exc.param if isinstance(exc, InvalidRequestError) else None
            if isinstance(exc, ModelNotFoundError):
                param = "model"
            return ErrorReply(status, kind, code, grpc_code, str(exc), param)
    where = f" (request {request_id})" if request_id else ""
    return ErrorReply(
        500, "server_error", None, grpc.StatusCode.INTERNAL, f"internal error{where}; see logs"
    )


def http_error(status: int, message: str, code: str | None = None) -> ErrorReply:
    """A reply for protocol-level failures that have no typed error (404 path, 405 method)."""
    kind = _INVALID if status < 500 else "server_error"
    return ErrorReply(status, kind, code, grpc.StatusCode.UNKNOWN, message)
