"""A failed or mismatched prefill is judged a fallback, never used (the bodies themselves are
loom_runtime.wire.pd's, tested there)."""

from __future__ import annotations

from typing import Any

import pytest

from loom_router.core.endpoints import Endpoint
from loom_router.shell.pd_flow import judge_prefill
from loom_runtime.wire.kv_transfer import FIELD

DECODE = Endpoint("d0", "http://d0", "decode", "v1")


@pytest.mark.parametrize(
    ("status", "answer", "headers", "fallback"),
    [
        (200, {FIELD: {"do_remote_prefill": True, "weights_version": "v1"}}, {}, None),
        (200, {FIELD: {"do_remote_prefill": True}}, {"x-loom-weights-version": "v1"}, None),
        (
            200,
            {FIELD: {"do_remote_prefill": True, "weights_version": "v2"}},
            {},
            "version_mismatch",
        ),
        (
            200,
            {FIELD: {"do_remote_prefill": True}},
            {"x-loom-weights-version": "v2"},
            "version_mismatch",
        ),
        (200, {"choices": []}, {}, "no_params"),
        (503, {"error": {"message": "paused"}}, {}, "status"),
    ],
)
def test_judging_the_prefill_answer(
    status: int, answer: dict[str, Any], headers: dict[str, str], fallback: str | None
) -> None:
    outcome = judge_prefill(status, answer, headers, DECODE)
    assert outcome.fallback == fallback
    assert (outcome.params is None) == (fallback is not None)
    assert outcome.mode == ("local-prefill" if fallback else "remote-prefill")
    if fallback:
        assert fallback in (outcome.header("p0") or "") and "p0" in (outcome.header("p0") or "")
