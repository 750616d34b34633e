"""Stop strings: the earliest match wins, straddling matches are found, streaming holds back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom_runtime.engine.stop import StopMatch, find_stop, holdback


@pytest.mark.parametrize(
    ("text", "stops", "searched", "expected"),
    [
        ("hello world", ["wor"], 0, 6),
        ("hello world", ["xyz"], 0, None),
        ("hello world", ["world", "lo"], 0, 3),  # earliest start wins
        ("abcSTOP", ["STOP"], 5, 3),  # straddles the already-searched part
        ("STOPabc", ["STOP"], 7, None),  # entirely in the searched part: not new
        ("aaa", [""], 0, None),  # empty stop strings are ignored
    ],
)
def test_find_stop(text: str, stops: list[str], searched: int, expected: int | None) -> None:
    found = find_stop(text, stops, searched)
    assert (None if found is None else found.start) == expected
    if found is not None:
        assert any(text[found.start : found.end] == s for s in stops)  # the match's own end


def test_a_tie_at_one_start_is_the_first_listed_stop_string() -> None:
    assert find_stop("say hello", ["hell", "hello", "he"], 0) == StopMatch(4, 8)


@pytest.mark.parametrize(
    ("text", "stops", "expected"),
    [
        ("hello wo", ["world"], 2),
        ("hello w", ["world", "xy"], 1),
        ("hello", ["world"], 0),
        ("ab", ["abc", "bcd"], 2),
        ("", ["abc"], 0),
        ("abc", ["abc"], 0),  # a whole stop string is a match, not a holdback
    ],
)
def test_holdback(text: str, stops: list[str], expected: int) -> None:
    assert holdback(text, stops) == expected


@given(st.text("ab", max_size=12), st.lists(st.text("ab", min_size=1, max_size=4), max_size=3))
def test_streaming_stops_at_the_first_match_to_end(text: str, stops: list[str]) -> None:
    # Searching after each new character finds a match as soon as the first one is complete.
    ends = [text.find(s) + len(s) for s in stops if s in text]
    for i in range(1, len(text) + 1):
        found = find_stop(text[:i], stops, i - 1)
        if found is not None:
            assert i == min(ends)
            assert any(text.startswith(s, found.start) and found.start + len(s) <= i for s in stops)
            return
    assert not ends
