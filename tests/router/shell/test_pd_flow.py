"""The P/D contract the router follows is the one the runtime's minimal proxy pins, and a failed
or mismatched prefill is judged a fallback, never used."""

from __future__ import annotations

from typing import Any

import pytest

from loom_router.core.endpoints import Endpoint
from loom_router.shell.pd_flow import FIELD, decode_body, judge_prefill, prefill_body
from loom_runtime.testing import pd_proxy

DECODE = Endpoint("d0", "http://d0", "decode", "v1")
BODIES = [
    {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 9,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5},
]


@pytest.mark.parametrize("body", BODIES)
def test_requests_equal_the_runtime_pd_proxys(body: dict[str, Any]) -> None:
    assert prefill_body(body) == pd_proxy.prefill_body(body)
    answer = {FIELD: {"do_remote_prefill": True, "remote_block_ids": [1]}}
    assert decode_body(body, answer[FIELD]) == pd_proxy.decode_body(body, answer)
    assert decode_body(body, None) == pd_proxy.decode_body(body, None)


def test_prefill_body_never_asks_token_ids() -> None:
    assert "return_token_ids" not in prefill_body({"model": "m", "return_token_ids": True})


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
