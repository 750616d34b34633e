from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from loom_router.core.endpoints import Endpoint
from loom_router.core.filters import (
    PREFILL_ROLES,
    SERVING_ROLES,
    Rejection,
    filter_endpoints,
    rejection,
)
from loom_router.core.load import EngineMetrics, load_view

EndpointFactory = Callable[..., Endpoint]


@pytest.mark.parametrize(
    ("fields", "metrics", "version", "exclude", "reason"),
    [
        ({}, None, None, (), None),
        ({}, None, "v1", (), None),
        ({}, None, "v2", (), "weights version v1, request needs v2"),
        ({"down": True}, None, None, (), "marked down"),
        ({"ready": False}, None, None, (), "not ready"),
        ({"draining": True}, None, None, (), "draining"),
        ({}, None, None, ("e",), "excluded by the request (it failed there)"),
        ({"down": True, "draining": True}, None, None, (), "marked down"),  # first reason wins
        ({}, {"admission_open": False}, None, (), "admission closed (engine paused or stopping)"),
        ({}, {"admission_open": True}, None, (), None),
        (
            {},
            {"weights_version": "v2"},
            None,
            (),
            "engine reports weights version v2, discovery says v1",
        ),
        ({}, {"weights_version": "v1"}, None, (), None),
    ],
)
def test_rejection_rules(
    endpoint: EndpointFactory,
    fields: dict[str, Any],
    metrics: dict[str, Any] | None,
    version: str | None,
    exclude: tuple[str, ...],
    reason: str | None,
) -> None:
    e = endpoint("e", version="v1", **fields)
    view = load_view({"e": EngineMetrics(**metrics)} if metrics else {})
    assert rejection(e, view, version, exclude) == reason


def test_stale_admission_metric_does_not_reject(endpoint: EndpointFactory) -> None:
    # Without a fresh scrape, admission is unknown: discovery's readiness decides.
    assert rejection(endpoint("e"), load_view()) is None


def test_filter_partitions_by_role_and_reports_only_wanted_roles(
    endpoint: EndpointFactory,
) -> None:
    endpoints = [
        endpoint("p1", role="prefill"),
        endpoint("p2", role="prefill", draining=True),
        endpoint("d1"),
        endpoint("d2", down=True),
        endpoint("a1", role="aggregated", version="v2"),
    ]
    serving = filter_endpoints(endpoints, SERVING_ROLES, load_view())
    assert [e.id for e in serving.kept] == ["d1", "a1"]
    assert serving.rejected == (Rejection("d2", "marked down"),)
    prefill = filter_endpoints(endpoints, PREFILL_ROLES, load_view(), weights_version="v1")
    assert [e.id for e in prefill.kept] == ["p1"]
    assert prefill.rejected == (Rejection("p2", "draining"),)


def test_a_decode_on_v2_never_pairs_with_a_prefill_on_v1(endpoint: EndpointFactory) -> None:
    endpoints = [endpoint("p1", role="prefill", version="v1")]
    assert filter_endpoints(endpoints, PREFILL_ROLES, load_view(), weights_version="v2").kept == ()
