"""The Lease rule of leader election: acquire free or expired leases, renew our own, wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loom_operator.k8s.leader import next_step

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def lease(holder: str | None, renewed_ago_s: float | None, duration: int = 15) -> dict[str, Any]:
    spec: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": duration}
    if renewed_ago_s is not None:
        spec["renewTime"] = (NOW - timedelta(seconds=renewed_ago_s)).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        )
    return {"metadata": {"resourceVersion": "1"}, "spec": spec}


@pytest.mark.parametrize(
    ("current", "step"),
    [
        (None, "acquire"),  # no lease yet
        (lease("me", 1), "renew"),
        (lease("me", 60), "renew"),  # ours, even if late: renew it
        (lease("other", 1), "wait"),  # held and live
        (lease("other", 14.9), "wait"),
        (lease("other", 15), "acquire"),  # expired
        (lease(None, None), "acquire"),  # released
        (lease("other", None), "acquire"),  # never renewed
    ],
)
def test_next_step(current: dict[str, Any] | None, step: str) -> None:
    assert next_step(current, "me", NOW) == step
