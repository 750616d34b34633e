from __future__ import annotations

import pytest

from loom_router.core.hotspot import HotSpots, hot_spots, strip_locality


@pytest.mark.parametrize(
    ("loads", "margin", "hot"),
    [
        ({}, 0.2, set()),
        ({"a": 0, "b": 0, "c": 0, "d": 0}, 0.2, set()),
        ({"a": 1, "b": 0, "c": 0, "d": 0}, 0.2, set()),  # mean .25 → limit 1.3
        ({"a": 2, "b": 0, "c": 0, "d": 0}, 0.2, {"a"}),  # mean .5 → limit 1.6
        ({"a": 2, "b": 1, "c": 1, "d": 1}, 0.2, set()),  # mean 1.25 → limit 2.5
        ({"a": 10, "b": 8, "c": 8, "d": 6}, 0.2, set()),  # mean 8 → limit 10.6
        ({"a": 11, "b": 8, "c": 8, "d": 6}, 0.2, {"a"}),  # mean 8.25 → limit 10.9
        ({"a": 11, "b": 8, "c": 8, "d": 6}, 0.5, set()),  # a wider margin tolerates it
        ({"a": 30, "b": 30, "c": 0, "d": 0}, 0.0, {"a", "b"}),  # mean 15 → limit 16
        ({"a": 5}, 0.0, set()),  # alone: never hotter than itself
    ],
)
def test_hot_iff_load_above_mean_times_one_plus_margin_plus_one(
    loads: dict[str, float], margin: float, hot: set[str]
) -> None:
    assert hot_spots(loads, margin).hot == hot


def test_hot_spots_reports_the_numbers() -> None:
    spots = hot_spots({"a": 2, "b": 0, "c": 0, "d": 0}, 0.2)
    assert spots.mean_load == 0.5 and spots.threshold == pytest.approx(1.6)


@pytest.mark.parametrize(
    ("blocks", "session", "hot", "out_blocks", "out_session", "spilled"),
    [
        ({"a": 5, "b": 3}, None, set(), {"a": 5, "b": 3}, None, ()),
        ({"a": 5, "b": 3}, None, {"a"}, {"a": 0, "b": 3}, None, ("a",)),
        ({"a": 5, "b": 3}, "a", {"a"}, {"a": 0, "b": 3}, None, ("a",)),
        ({"a": 0, "b": 3}, "b", {"a"}, {"a": 0, "b": 3}, "b", ()),  # a had no credit to lose
        ({"a": 0, "b": 0}, "a", {"a"}, {"a": 0, "b": 0}, None, ("a",)),
    ],
)
def test_hot_endpoints_lose_prefix_and_session_credit(
    blocks: dict[str, int],
    session: str | None,
    hot: set[str],
    out_blocks: dict[str, int],
    out_session: str | None,
    spilled: tuple[str, ...],
) -> None:
    spots = HotSpots(frozenset(hot), 0.0, 0.0)
    assert strip_locality(blocks, session, spots) == (out_blocks, out_session, spilled)
