"""Reasoning read out of a chat output, whole or as it streams (vLLM's reasoning parsers):
`<think>...</think>` becomes `reasoning`, the rest `content`. Both glm45 and deepseek_r1 read it
as vLLM 0.33 does: the template has opened `<think>` (GLM-4.7/5, DeepSeek-R1), so the output is
reasoning until `</think>`, and a `<think>` the model still writes first is dropped; an output
without `</think>` is all reasoning.

Owns the split; never parses tool calls (they are read from the content afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loom_runtime.wire.openai.chat.formats import partial_suffix

START, END = "<think>", "</think>"
_State = Literal["start", "reasoning", "content"]


@dataclass(frozen=True)
class Split:
    """Reasoning text and content text of one step (or of a whole output)."""

    reasoning: str = ""
    content: str = ""


class ReasoningStream:
    """One output's reasoning split as text arrives (its owner: the response writer)."""

    def __init__(self) -> None:
        self._state: _State = "start"
        self._held = ""

    def feed(self, delta: str) -> Split:
        self._held += delta
        if self._state == "start":
            self._state = self._opening()
            if self._state == "start":
                return Split()
        if self._state == "content":
            out, self._held = self._held, ""
            return Split(content=out)
        return self._in_reasoning()

    def finish(self) -> Split:
        """What is left once the output has ended (a partial tag is text after all)."""
        out, self._held = self._held, ""
        if self._state == "content":
            return Split(content=out)
        return Split(reasoning=out)

    def _opening(self) -> _State:
        body = self._held.lstrip()
        if body.startswith(START):
            self._held = body[len(START) :]
            return "reasoning"
        if START.startswith(body):
            return "start"  # whitespace or a partial `<think>` so far
        return "reasoning"

    def _in_reasoning(self) -> Split:
        at = self._held.find(END)
        if at >= 0:
            reasoning, rest = self._held[:at], self._held[at + len(END) :]
            self._state, self._held = "content", ""
            return Split(reasoning, rest)
        keep = partial_suffix(self._held, END)
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return Split(reasoning=out)


def split(text: str) -> Split:
    """A whole output's reasoning and content (the stream's pieces, joined)."""
    stream = ReasoningStream()
    one, two = stream.feed(text), stream.finish()
    return Split(one.reasoning + two.reasoning, one.content + two.content)
