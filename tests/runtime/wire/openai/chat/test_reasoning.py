"""Reasoning read out of the output (glm45 and deepseek_r1 read alike, as in vLLM 0.33): the
template opened `<think>`, so the output is reasoning until `</think>`; streamed pieces add up
to the whole read however the text is cut."""

from __future__ import annotations

import pytest

from loom_runtime.wire.openai.chat.reasoning import ReasoningStream, Split, split

CASES = [
    ("weigh it</think>\n\nIt is 4.", Split("weigh it", "\n\nIt is 4.")),
    ("<think>weigh it</think>It is 4.", Split("weigh it", "It is 4.")),
    ("\n<think>a<b</think>c", Split("a<b", "c")),
    ("thinking with no end", Split("thinking with no end", "")),
    ("</think>only content", Split("", "only content")),
    ("", Split("", "")),
    ("a</thi", Split("a</thi", "")),
    ("x</think>y</think>z", Split("x", "y</think>z")),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_reasoning_and_content_of_a_whole_output(text: str, expected: Split) -> None:
    assert split(text) == expected


@pytest.mark.parametrize("size", [1, 2, 5])
@pytest.mark.parametrize(("text", "expected"), CASES)
def test_streamed_reasoning_adds_up_to_the_whole_read(
    text: str, expected: Split, size: int
) -> None:
    stream = ReasoningStream()
    parts = [stream.feed(text[i : i + size]) for i in range(0, len(text), size)]
    parts.append(stream.finish())
    assert Split("".join(p.reasoning for p in parts), "".join(p.content for p in parts)) == expected


def test_a_partial_end_tag_is_held_until_it_resolves() -> None:
    stream = ReasoningStream()
    assert stream.feed("hmm</th") == Split("hmm", "")
    assert stream.feed("ink>ok") == Split("", "ok")
