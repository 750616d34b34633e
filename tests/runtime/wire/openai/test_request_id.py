"""Request ids: a short printable client id is kept (as is by the router, embedded by a worker)."""

from __future__ import annotations

import re

import pytest

from loom_runtime.wire.openai.request_id import (
    MAX_CLIENT_ID,
    client_id,
    router_request_id,
    worker_request_id,
)

KEPT = ["abc", "a" * MAX_CLIENT_ID, "req 1/2"]
REPLACED = ["", "a" * (MAX_CLIENT_ID + 1), "bad\nid", "tab\there"]


@pytest.mark.parametrize("given", KEPT)
def test_a_kept_client_id_is_used(given: str) -> None:
    assert client_id(given) == given
    assert router_request_id(given) == given
    assert re.fullmatch(rf"cmpl-{re.escape(given)}-[0-9a-f]{{8}}", worker_request_id(given, "cmpl"))


@pytest.mark.parametrize("given", REPLACED)
def test_other_ids_are_replaced_by_fresh_ones(given: str) -> None:
    assert client_id(given) is None
    assert re.fullmatch(r"rtr-[0-9a-f]{32}", router_request_id(given))
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", worker_request_id(given, "chatcmpl"))


def test_worker_ids_are_unique_even_for_one_client_id() -> None:
    assert worker_request_id("x", "cmpl") != worker_request_id("x", "cmpl")
