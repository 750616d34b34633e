"""Tool calls read out of a text, whole or as it streams: content before the calls stays
content, the calls become `tool_calls` (a message's, or deltas: id and name once, then
arguments fragments). Output that is not well-formed calls is content, never an error.

Owns driving a ToolFormat over text; never knows a format's syntax and never does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loom_runtime.wire.openai.chat.calls import CallDelta, CallIds, FunctionCall, PartialCall
from loom_runtime.wire.openai.chat.formats import Schemas, ToolFormat


@dataclass(frozen=True)
class Extracted:
    """A whole output read: its content (None when only calls) and its calls."""

    content: str | None
    calls: tuple[FunctionCall, ...] = ()


def extract(
    fmt: ToolFormat, text: str, schemas: Schemas, max_calls: int | None = None
) -> Extracted:
    """The calls of a whole output (at most `max_calls`), or all of it as content."""
    at = fmt.region_start(text)
    calls = None if at is None else fmt.calls(text[at:], schemas)
    if at is None or not calls:
        return Extracted(text)
    before = text[:at]
    return Extracted(before if before.strip() else None, tuple(calls[:max_calls]))


@dataclass(frozen=True)
class Pieces:
    """What one step of a stream sends: content text and call deltas."""

    content: str = ""
    calls: tuple[CallDelta, ...] = ()


@dataclass
class _Sent:
    id: str
    arguments: str = ""  # the arguments text sent
    done: bool = False


@dataclass
class ToolCallStream:
    """One streamed output's tool calls (its owner: the request's response writer)."""

    fmt: ToolFormat
    schemas: Schemas
    ids: CallIds
    max_calls: int | None = None
    _text: str = ""
    _region: int | None = None
    _content_sent: int = 0
    _sent: list[_Sent] = field(default_factory=list)

    @property
    def called(self) -> bool:
        """Whether any call was sent."""
        return bool(self._sent)

    def feed(self, delta: str) -> Pieces:
        self._text += delta
        if self._region is None:
            self._region = self.fmt.region_start(self._text)
        if self._region is None:
            return Pieces(self._content_to(len(self._text) - self.fmt.held_back(self._text)))
        content = self._content_to(self._region)
        parts = self.fmt.partial(self._text[self._region :], self.schemas)
        return Pieces(content, self._deltas(parts))

    def finish(self) -> Pieces:
        """What is left once the output has ended."""
        if self._region is None:
            return Pieces(self._content_to(len(self._text), final=True))
        calls = self.fmt.calls(self._text[self._region :], self.schemas)
        if calls is None and not self._sent:  # not calls after all: plain content
            return Pieces(self._content_to(len(self._text), final=True))
        if calls is None:
            return Pieces("", self._closed())
        done = [PartialCall(c.name, c.arguments, done=True) for c in calls]
        return Pieces("", self._deltas(done))

    def _closed(self) -> tuple[CallDelta, ...]:
        out = []
        for index, sent in enumerate(self._sent):
            if not sent.done:
                out.append(CallDelta(index, "}" if sent.arguments else "{}"))
                sent.done = True
        return tuple(out)

    def _content_to(self, end: int, final: bool = False) -> str:
        """The content up to `end` not sent yet. Whitespace before any other content waits
        until the output shows more (as `extract` reads it, whitespace alone before the calls is
        no content at all)."""
        if end <= self._content_sent:
            return ""
        if not final and self._content_sent == 0 and not self._text[:end].strip():
            return ""
        out = self._text[self._content_sent : end]
        self._content_sent = end
        return out

    def _deltas(self, parts: list[PartialCall]) -> tuple[CallDelta, ...]:
        out: list[CallDelta] = []
        for index, part in enumerate(parts[: self.max_calls]):
            if index == len(self._sent):
                if part.name is None:
                    break
                self._sent.append(_Sent(self.ids()))
                out.append(CallDelta(index, "", self._sent[index].id, part.name))
            sent = self._sent[index]
            if len(part.arguments) > len(sent.arguments) and not sent.done:
                out.append(CallDelta(index, part.arguments[len(sent.arguments) :]))
                sent.arguments = part.arguments
            sent.done = sent.done or part.done
        return tuple(_merged(out))


def _merged(deltas: list[CallDelta]) -> list[CallDelta]:
    """A new call's first arguments fragment rides on its id/name delta."""
    out: list[CallDelta] = []
    for d in deltas:
        last = out[-1] if out else None
        if last is not None and last.index == d.index and d.id is None and not last.arguments:
            out[-1] = CallDelta(d.index, d.arguments, last.id, last.name)
        else:
            out.append(d)
    return out
