from __future__ import annotations

import pytest

from loom_router.core.scorers.session import MAX_TOKEN_CHARS, SessionTable
from loom_router.errors import ConfigError


def test_lookup_returns_where_the_session_went_last() -> None:
    table = SessionTable()
    table.record("s1", "a")
    table.record("s1", "b")
    assert table.lookup("s1") == "b"
    assert table.lookup("s2") is None
    assert table.lookup(None) is None and table.lookup("") is None


def test_table_is_an_lru_bounded_by_max_sessions() -> None:
    table = SessionTable(max_sessions=100)
    for i in range(1_000):
        table.record(f"s{i}", "a")
        table.lookup("s0")  # lookups do not keep a session alive; records do
    assert len(table) == 100 and table.evictions == 900
    assert table.lookup("s999") == "a" and table.lookup("s0") is None


def test_refreshing_a_session_keeps_it() -> None:
    table = SessionTable(max_sessions=2)
    table.record("old", "a")
    table.record("new", "a")
    table.record("old", "a")
    table.record("newer", "b")
    assert table.lookup("old") == "a" and table.lookup("new") is None


def test_forget_endpoint_and_oversized_tokens() -> None:
    table = SessionTable()
    table.record("s1", "a")
    table.record("s2", "b")
    table.record("x" * (MAX_TOKEN_CHARS + 1), "a")
    assert len(table) == 2
    assert table.forget_endpoint("a") == 1
    assert table.lookup("s1") is None and table.lookup("s2") == "b"


def test_size_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        SessionTable(0)
