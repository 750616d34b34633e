"""A chat stream whose output the worker reads back (tool calls, reasoning): its deltas pass
through the router as the worker wrote them, and it moves to another worker only before it has
sent anything, else a clear migration_failed."""

from __future__ import annotations

from typing import Any

import pytest

from loom_router.errors import MigrationFailedError

from .test_migration import chat, feed, started

TOOLS = [{"type": "function", "function": {"name": "f"}}]
CALL_DELTA = {"tool_calls": [{"index": 0, "id": "call-1", "type": "function",
                              "function": {"name": "f", "arguments": ""}}]}  # fmt: skip


def _read_back(delta: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    event = chat(None, ids)
    event["choices"][0]["delta"] |= delta
    return event


@pytest.mark.parametrize(
    "delta", [CALL_DELTA, {"reasoning": "hm", "reasoning_content": "hm"},
              {"content": "I will call", **CALL_DELTA}],
)  # fmt: skip
def test_tool_call_and_reasoning_deltas_pass_through_as_the_worker_wrote_them(
    delta: dict[str, Any],
) -> None:
    t = started("chat", tools=TOOLS)
    out = feed(t, [chat("", [], role=True), _read_back(delta, [10, 11])])
    assert out[-1]["choices"][0]["delta"] == delta


@pytest.mark.parametrize("body", [{"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "required"},
                                  {}])  # fmt: skip
def test_a_read_back_chat_stream_moves_only_before_it_sent_anything(body: dict[str, Any]) -> None:
    """Its reader's state stays on the worker: the original request again while nothing was
    sent, else a clear migration_failed, never a continuation that would corrupt the deltas."""
    fresh = started("chat", **body)
    feed(fresh, [chat("", [], role=True)])
    request = {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    assert fresh.replay("/v1/chat/completions", request).body["messages"]
    t = started("chat", **body)
    delta = CALL_DELTA if body else {"reasoning": "hm"}  # no tools: seen as reasoning
    feed(t, [chat("", [], role=True), _read_back(delta, [10])])
    with pytest.raises(MigrationFailedError, match="reads back"):
        t.replay("/v1/chat/completions", request)


def test_tools_with_tool_choice_none_stream_as_text_and_resume_as_text() -> None:
    t = started("chat", tools=TOOLS, tool_choice="none", return_token_ids=True)
    feed(t, [chat("", [], role=True), chat("A", [10]), chat("B", [11])])
    assert not t.read_back
