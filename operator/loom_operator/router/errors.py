"""Typed errors of the router core; the proxy shell maps each to one HTTP status in one place.

Owns the types only; raising sites say what was wrong, where, and what to do.
"""

from __future__ import annotations


class RouterError(Exception):
    """Base of every error the router raises on purpose."""


class RouterConfigError(RouterError, ValueError):
    """A router setting is out of range (a bug in the caller or a card the API let through)."""


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


class MetricsParseError(RouterError, ValueError):
    """A /metrics scrape is not Prometheus text; the endpoint's load counts as unknown."""


class KVEventDecodeError(RouterError, ValueError):
    """A KV-event message is not vLLM's wire format; the batch is dropped and counted."""
