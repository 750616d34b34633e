"""The value rules the worker's schema and the router's body check share."""

from __future__ import annotations

import pytest

from loom_runtime.wire.openai.fields import (
    INT_MAX,
    MAX_STOP_SEQUENCES,
    prompt_value,
    required,
    shown,
    stop_value,
)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("hi", ("hi",)),
        ([1, 2], ((1, 2),)),
        (["x"], ("x",)),
        ([[3]], ((3,),)),
        ([0, INT_MAX], ((0, INT_MAX),)),
        (["a", "b"], ("a", "b")),
        ([[1], "b", [2, 3]], ((1,), "b", (2, 3))),
    ],
)
def test_prompt_accepts_text_ids_and_lists_of_them(value: object, parsed: object) -> None:
    assert prompt_value(value) == parsed


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "prompt is empty"),
        ([], "prompt is empty"),
        (["a", ""], "prompt is empty (prompt 1)"),
        ([[1], [-1]], "item 0 is -1) (prompt 1)"),
        (["a"] * 257, "at most 256 prompts"),
        ([-1], "item 0 is -1"),
        ([1, True], "item 1 is True"),
        ([INT_MAX + 1], f"item 0 is {INT_MAX + 1}"),
        (None, "prompt must be a string or a list of token ids"),
        ([1, "a"], "item 1 is 'a'"),
        (5, "prompt must be a string or a list of token ids"),
    ],
)
def test_prompt_refusals_say_what_is_wrong(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        prompt_value(value)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("value", "text"), [(1, "1"), ("a" * 40, "'" + "a" * 36 + "..."), ("a" * 38, repr("a" * 38))]
)
def test_shown_cuts_long_values(value: object, text: str) -> None:
    assert shown(value) == text and len(shown(value)) <= 40


@pytest.mark.parametrize(("value", "parsed"), [(None, ()), ("x", ("x",)), (["a", "b"], ("a", "b"))])
def test_stop_values(value: object, parsed: tuple[str, ...]) -> None:
    assert stop_value(value) == parsed


@pytest.mark.parametrize("value", ["", [""], [1], {"a": 1}, ["s"] * (MAX_STOP_SEQUENCES + 1)])
def test_bad_stop_values_are_refused(value: object) -> None:
    with pytest.raises(ValueError):
        stop_value(value)


def test_required_names_the_field() -> None:
    assert required("messages") == "messages is required"
