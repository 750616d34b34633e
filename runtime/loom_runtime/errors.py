"""Typed errors of the runtime, each mapped to one HTTP/gRPC status in serve/errors.py.

Raise these with a message that says what was wrong, where, and what to do; never map them here.
"""

from __future__ import annotations


class LoomError(Exception):
    """Base of every error Loom raises on purpose."""


class InvalidRequestError(LoomError):
    """The client sent something malformed or out of range (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFoundError(LoomError):
    """The request names a model this worker does not serve (HTTP 404)."""


class AdmissionError(LoomError):
    """The worker will not take the request now: paused, draining or full (HTTP 503)."""


class TransferError(LoomError):
    """A KV transfer failed (HTTP 500 unless the policy recomputes)."""


class CheckpointError(LoomError):
    """A checkpoint directory is missing files or does not match its config."""


class WorkerLostError(LoomError):
    """The worker cannot go on (its rank processes are gone): its step thread aborts what was
    in flight and stops, its health check fails, and the fleet replaces it (HTTP 503 meanwhile)."""


class SpeculativeConfigError(LoomError):
    """Speculative decoding was asked of a model, role or engine that cannot run it."""
