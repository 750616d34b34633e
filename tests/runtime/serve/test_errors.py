"""The one error mapping: each typed error gets its HTTP status, OpenAI type/code and gRPC code."""

from __future__ import annotations

import grpc
import pytest

from loom_runtime.card.errors import CardError, FieldError
from loom_runtime.errors import (
    AdmissionError,
    CheckpointError,
    InvalidRequestError,
    LoomError,
    ModelNotFoundError,
    TransferError,
)
from loom_runtime.kv.errors import OutOfBlocksError
from loom_runtime.serve.errors import (
    ControlStateError,
    EngineStalledError,
    RequestAbortedError,
    UnauthenticatedError,
    classify,
    http_error,
)

G = grpc.StatusCode
BAD = "invalid_request_error"
TABLE = [
    (InvalidRequestError("bad", param="top_p"), 400, BAD, None, G.INVALID_ARGUMENT),
    (ModelNotFoundError("nope"), 404, "invalid_request_error", "model_not_found", G.NOT_FOUND),
    (AdmissionError("paused"), 503, "service_unavailable_error", "admission_closed", G.UNAVAILABLE),
    (OutOfBlocksError(9, 1), 503, "service_unavailable_error", "admission_closed", G.UNAVAILABLE),
    (RequestAbortedError("x"), 503, "service_unavailable_error", "request_aborted", G.ABORTED),
    (EngineStalledError("x"), 504, "server_error", "engine_stalled", G.DEADLINE_EXCEEDED),
    (ControlStateError("x"), 409, "invalid_request_error", "wrong_state", G.FAILED_PRECONDITION),
    (UnauthenticatedError("x"), 401, "authentication_error", "unauthenticated", G.UNAUTHENTICATED),
    (CheckpointError("x"), 400, "invalid_request_error", "invalid_checkpoint", G.INVALID_ARGUMENT),
    (CardError([FieldError("a", "b")]), 400, BAD, "invalid_card", G.INVALID_ARGUMENT),
    (TransferError("x"), 500, "server_error", "kv_transfer_failed", G.INTERNAL),
    (LoomError("x"), 500, "server_error", None, G.INTERNAL),
]  # fmt: skip


@pytest.mark.parametrize(("exc", "status", "kind", "code", "grpc_code"), TABLE)
def test_each_typed_error_has_one_status(
    exc: Exception, status: int, kind: str, code: str | None, grpc_code: grpc.StatusCode
) -> None:
    reply = classify(exc)
    assert (reply.http_status, reply.type, reply.code, reply.grpc_code) == (
        status,
        kind,
        code,
        grpc_code,
    )
    assert reply.message == str(exc)


def test_error_body_is_the_openai_shape_with_param() -> None:
    body = classify(InvalidRequestError("top_p must be <= 1", param="top_p")).body()
    assert body == {
        "error": {
            "message": "top_p must be <= 1",
            "type": "invalid_request_error",
            "param": "top_p",
            "code": None,
        }
    }
    assert classify(ModelNotFoundError("no")).param == "model"


def test_unexpected_errors_hide_their_text_and_name_the_request() -> None:
    reply = classify(KeyError("secret internals"), request_id="cmpl-7")
    assert reply.http_status == 500
    assert "secret" not in reply.message
    assert "cmpl-7" in reply.message


def test_protocol_level_errors_use_the_same_body() -> None:
    reply = http_error(405, "method not allowed")
    assert reply.body()["error"]["type"] == "invalid_request_error"
    assert http_error(503, "x").type == "server_error"
