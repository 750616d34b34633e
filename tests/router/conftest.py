"""Fixtures for the router tests: endpoint and load builders over plain data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from loom_router.core.endpoints import Endpoint
from loom_router.core.load import EngineMetrics, LoadView, load_view

EndpointFactory = Callable[..., Endpoint]
LoadFactory = Callable[..., LoadView]


@pytest.fixture
def endpoint() -> EndpointFactory:
    """endpoint("d0", role="decode", weights_version="v1", ...) with a URL derived from the id."""

    def make(endpoint_id: str, role: str = "decode", version: str = "v1", **kw: Any) -> Endpoint:
        return Endpoint(
            id=endpoint_id,
            url=f"http://{endpoint_id}:8000",
            role=role,  # type: ignore[arg-type]
            weights_version=version,
            **kw,
        )

    return make


@pytest.fixture
def load() -> LoadFactory:
    """load(metrics={"d0": dict(waiting=1)}, in_flight={"d0": 2}) -> LoadView."""

    def make(
        metrics: dict[str, dict[str, Any]] | None = None, in_flight: dict[str, int] | None = None
    ) -> LoadView:
        fresh = {eid: EngineMetrics(**values) for eid, values in (metrics or {}).items()}
        return load_view(fresh, in_flight)

    return make
