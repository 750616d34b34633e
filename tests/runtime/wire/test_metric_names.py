"""Metric names: the sample names a counter, an info and a router metric are exposed under."""

from __future__ import annotations

import pytest

from loom_runtime.wire.metric_names import (
    REQUEST_SUCCESS,
    ROUTER_REQUESTS,
    WEIGHTS_VERSION,
    info,
    router_metric,
    total,
)


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        (total(REQUEST_SUCCESS), "vllm:request_success_total"),
        (info(WEIGHTS_VERSION), "loom:weights_version_info"),
        (router_metric(ROUTER_REQUESTS), "loom_router:requests"),
        (total(router_metric(ROUTER_REQUESTS)), "loom_router:requests_total"),
    ],
)
def test_sample_names(sample: str, expected: str) -> None:
    assert sample == expected
