"""A profile's prompts: exactly as long as asked, made of the tokenizer's own ids, and never two
with the same first ids (so the prefix cache shortens none of them)."""

from __future__ import annotations

import pytest

from loom_operator.profile.prompts import LEAD_DIGITS, prompt_ids, token_pool


def test_the_pool_keeps_distinct_ids_in_order() -> None:
    assert token_pool([5, 7, 5, 9, 7]) == (5, 7, 9)
    with pytest.raises(ValueError, match="need 2"):
        token_pool([3, 3, 3])


@pytest.mark.parametrize("length", [1, LEAD_DIGITS, LEAD_DIGITS + 1, 300])
def test_a_prompt_is_as_long_as_asked_and_made_of_pool_ids(length: int) -> None:
    pool = (11, 22, 33)
    ids = prompt_ids(pool, 7, length)
    assert len(ids) == length
    assert set(ids) <= set(pool)


def test_no_two_requests_share_their_first_ids() -> None:
    pool = (11, 22, 33)
    leads = {tuple(prompt_ids(pool, n, 40)[:LEAD_DIGITS]) for n in range(len(pool) ** LEAD_DIGITS)}
    assert len(leads) == len(pool) ** LEAD_DIGITS
