"""Every strategy a card may name (or a push's mode picks) has one registered implementation,
under that name."""

from __future__ import annotations

from typing import get_args

import pytest

from loom_operator.fleet.desired import Strategy
from loom_operator.fleet.strategies.registry import STRATEGIES, UnknownStrategy, strategy_named


@pytest.mark.parametrize("name", get_args(Strategy))
def test_each_card_strategy_is_registered_under_its_own_name(name: str) -> None:
    assert strategy_named(name).name == name


def test_versions_mix_under_rolling_only() -> None:
    assert {n: s.mixes_versions for n, s in STRATEGIES.items()} == {
        "Rolling": True,
        "Barrier": False,
        "Keep": True,
    }


def test_only_keep_loads_workers_under_their_running_requests() -> None:
    assert {n: s.keeps_running for n, s in STRATEGIES.items()} == {
        "Rolling": False,
        "Barrier": False,
        "Keep": True,
    }


def test_an_unknown_strategy_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UnknownStrategy, match=r"'Sideways'.*known: Barrier, Keep, Rolling"):
        strategy_named("Sideways")
