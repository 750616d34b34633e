"""The router's own body checks: what it cannot route gets a 400 naming the field (never a
crash), what it can is left alone, and the context length is judged by the worker's rule."""

from __future__ import annotations

from typing import Any

import pytest

from loom_router.core.body_check import (
    check_body,
    check_context,
    check_rewritten_fields,
    parse_body,
    prefilled_where_decoded,
)
from loom_router.errors import BadRequestError, classify
from loom_runtime.wire.pd import several_prompts

REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    # (kind, body, param, words in the message)
    ("completion", {}, "prompt", "required"),
    ("completion", {"prompt": 5}, "prompt", "string or a list"),
    ("completion", {"prompt": [-5]}, "prompt", "item 0"),
    ("completion", {"prompt": [1, True]}, "prompt", "item 1"),
    ("completion", {"prompt": [1.5]}, "prompt", "item 0"),
    ("completion", {"prompt": [2**63]}, "prompt", "item 0"),
    ("completion", {"prompt": [[-1]]}, "prompt", "item 0"),
    ("completion", {"prompt": [["a"]]}, "prompt", "item 0"),
    ("completion", {"prompt": [[1], [-2]]}, "prompt", "(prompt 1)"),
    ("completion", {"prompt": ["a", ""]}, "prompt", "empty (prompt 1)"),
    ("completion", {"prompt": ""}, "prompt", "empty"),
    ("completion", {"prompt": [[]]}, "prompt", "empty"),
    ("completion", {"prompt": None}, "prompt", "string or a list"),
    ("completion", {"prompt": {"a": 1}}, "prompt", "string or a list"),
    ("chat", {}, "messages", "required"),
    ("chat", {"messages": "hi"}, "messages", "array"),
    ("chat", {"messages": []}, "messages", "at least one"),
    ("chat", {"messages": [5]}, "messages[0]", "object"),
    ("chat", {"messages": [{"content": "x"}]}, "messages[0].role", "string"),
    ("chat", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "string"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content", "only 'text'"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "body", "param", "words"), REFUSED)
def test_unroutable_bodies_get_a_400_naming_the_field(
    kind: Any, body: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(BadRequestError) as info:
        check_body(kind, body)
    reply = classify(info.value)
    assert reply.status == 400
    assert reply.body()["error"]["param"] == param
    assert words in reply.message


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("completion", {"prompt": "hi"}),
        ("completion", {"prompt": [1, 2, 3]}),
        ("completion", {"prompt": ["hi"]}),
        ("completion", {"prompt": [[1, 2]]}),
        ("completion", {"prompt": ["a", [1, 2]]}),
        ("chat", {"messages": [{"role": "user", "content": "hi"}]}),
        ("chat", {"messages": [{"role": "robot", "content": [{"type": "text", "text": "a"}]}]}),
    ],
)
def test_routable_bodies_pass(kind: Any, body: dict[str, Any]) -> None:
    check_body(kind, body)  # the worker judges the rest (a robot role, the sampling fields)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{not json", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b'{"prompt": "\\ud800"}', "lone surrogate"),
    ],
)
def test_bodies_the_worker_would_not_parse_are_refused(raw: bytes, words: str) -> None:
    with pytest.raises(BadRequestError, match=words):
        parse_body(raw)


def test_surrogate_pairs_are_text() -> None:
    assert parse_body(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}


CONTEXT = [
    # (kind, body, prompt_len, max_model_len, param or None when it fits)
    ("completion", {}, 100, 116, None),  # the default 16 fits exactly
    ("completion", {}, 100, 110, None),  # the default is clamped to the room
    ("completion", {}, 110, 110, "prompt"),
    ("completion", {"max_tokens": 20}, 100, 110, "max_tokens"),
    ("completion", {"max_tokens": "junk"}, 100, 110, None),  # the worker refuses junk
    ("chat", {}, 100, 101, None),
    ("chat", {"max_completion_tokens": 2, "max_tokens": 1}, 100, 101, "max_tokens"),
    ("chat", {}, 2100, 2048, "messages"),
]


@pytest.mark.parametrize(("kind", "body", "n", "max_len", "param"), CONTEXT)
def test_context_length_is_the_workers_rule(
    kind: Any, body: dict[str, Any], n: int, max_len: int, param: str | None
) -> None:
    if param is None:
        check_context(kind, body, n, max_len)
        return
    with pytest.raises(BadRequestError, match="maximum context length") as info:
        check_context(kind, body, n, max_len)
    assert info.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"stream": "yes"}, "stream"),
        ({"return_token_ids": 1}, "return_token_ids"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_completion_tokens": 2**40}, "max_completion_tokens"),
        ({"stream": True, "stream_options": 5}, "stream_options"),
        (
            {"stream": True, "stream_options": {"include_usage": "y"}},
            "stream_options.include_usage",
        ),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"max_completion_tokens": 4, "max_tokens": 9, "min_tokens": 5}, "min_tokens"),
    ],
)
def test_fields_the_prefill_rewrites_are_checked_before_it(
    body: dict[str, Any], param: str
) -> None:
    """The prefill step sets stream, max_tokens and drops stream_options: it cannot refuse them,
    and the decode would, leaving the prefill's KV lease to expire."""
    with pytest.raises(BadRequestError) as info:
        check_rewritten_fields(body)
    assert info.value.param == param


def test_good_rewritten_fields_pass() -> None:
    check_rewritten_fields(
        {"stream": True, "max_tokens": 5, "max_completion_tokens": None, "return_token_ids": False,
         "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    )  # fmt: skip


def test_several_prompts_are_a_list_of_more_than_one() -> None:
    assert several_prompts({"prompt": ["a", "b"]}) and several_prompts({"prompt": [[1], [2]]})
    assert not several_prompts({"prompt": ["a"]}) and not several_prompts({"prompt": [1, 2]})
    assert not several_prompts({"prompt": "ab"}) and not several_prompts({"messages": []})


@pytest.mark.parametrize(
    ("kind", "body", "local"),
    [
        ("completion", {"prompt": "ab"}, False),
        ("completion", {"prompt": ["a", "b"]}, True),
        ("completion", {"prompt": "ab", "echo": True}, False),  # text only: the decode echoes it
        ("completion", {"prompt": "ab", "echo": True, "logprobs": 0}, True),
        ("completion", {"prompt": "ab", "logprobs": 1}, False),
        ("completion", {"prompt": "ab", "prompt_logprobs": 0}, True),
        ("chat", {"messages": [], "prompt_logprobs": 1}, True),
        ("chat", {"messages": [], "n": 2}, False),
    ],
)
def test_prompt_lists_and_prompt_logprobs_are_prefilled_where_decoded(
    kind: str, body: dict[str, Any], local: bool
) -> None:
    assert prefilled_where_decoded(kind, body) is local
