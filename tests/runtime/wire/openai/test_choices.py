"""The numbering of a request's samples: ids, prompts, leaders, seeds and which best_of keeps."""

from __future__ import annotations

import pytest

from loom_runtime.wire.openai.choices import Choices
from loom_runtime.wire.openai.fields import SEED_MAX, SEED_MIN


def test_samples_are_numbered_prompt_by_prompt_and_lead_by_their_first() -> None:
    c = Choices(num_prompts=2, n=2, samples=3)
    assert c.total == 6 and c.ranked
    assert [c.engine_id("r", k) for k in (0, 5)] == ["r-0", "r-5"]
    assert [c.prompt_of(k) for k in range(6)] == [0, 0, 0, 1, 1, 1]
    assert [c.leader_of(k) for k in range(6)] == [None, 0, 0, None, 3, 3]
    assert Choices(1).engine_id("r", 0) == "r"


def test_seeds_are_the_requests_plus_the_position_and_wrap_in_range() -> None:
    assert [Choices.seed(10, k) for k in range(3)] == [10, 11, 12]
    assert Choices.seed(None, 2) is None
    assert Choices.seed(SEED_MAX, 1) == SEED_MIN


def test_best_of_keeps_the_highest_scores_of_each_prompt_in_rank_order() -> None:
    c = Choices(num_prompts=2, n=2, samples=3)
    assert c.kept([-3.0, -1.0, -2.0, -0.5, -0.5, -9.0]) == [1, 2, 3, 4]  # ties: sample order
    assert Choices(2, 2, 2).kept([0.0] * 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        c.kept([0.0])
    with pytest.raises(ValueError):
        Choices(1, n=3, samples=2)
