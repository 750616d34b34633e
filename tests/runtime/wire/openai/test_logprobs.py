"""Logprobs in both OpenAI shapes, from token ids or from token texts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loom_runtime.wire.openai.logprobs import (
    COMPLETION_FIELDS,
    chat_entry,
    chat_logprobs,
    chat_token,
    completion_logprobs,
)


@dataclass(frozen=True)
class Entry:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


TEXT = {1: "a", 2: "bé", 3: ""}.__getitem__


@pytest.mark.parametrize(
    ("entries", "offset", "tokens", "offsets"),
    [
        ((), 0, [], []),
        ((Entry(1, -0.1),), 5, ["a"], [5]),
        ((Entry(1, -0.1), Entry(2, -0.2), Entry(3, 0.0), Entry(1, -1.0)), 0,
         ["a", "bé", "", "a"], [0, 1, 3, 3]),
    ],
)  # fmt: skip
def test_completion_offsets_count_characters(
    entries: tuple[Entry, ...], offset: int, tokens: list[str], offsets: list[int]
) -> None:
    out = completion_logprobs(entries, TEXT, offset)
    assert tuple(out) == COMPLETION_FIELDS
    assert out["tokens"] == tokens and out["text_offset"] == offsets
    assert out["token_logprobs"] == [e.logprob for e in entries]


@pytest.mark.parametrize(("text", "raw"), [("a", b"a"), ("bé", "bé".encode()), ("", b"")])
def test_chat_token_carries_utf8_bytes(text: str, raw: bytes) -> None:
    assert chat_token(text, -1.0) == {"token": text, "logprob": -1.0, "bytes": list(raw)}


def test_chat_logprobs_from_ids_equal_entries_from_texts() -> None:
    entries = (Entry(2, -0.2, ((2, -0.2), (1, -3.0))),)
    by_id = chat_logprobs(entries, TEXT)
    by_text = {"content": [chat_entry("bé", -0.2, [("bé", -0.2), ("a", -3.0)])]}
    assert by_id == by_text
    assert list(by_id["content"][0]) == ["token", "logprob", "bytes", "top_logprobs"]
