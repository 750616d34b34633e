"""Server-sent events from an upstream: splitting a byte stream into `data:` payloads.

Owns the decoding only (pure, incremental); never parses the JSON inside an event and never
writes one (loom_runtime.wire.openai.sse frames what the router sends, as the worker does).
"""

from __future__ import annotations

from loom_router.errors import RouterError

MAX_EVENT_BYTES = 16 << 20


class SSEFormatError(RouterError, ValueError):
    """An upstream event is larger than MAX_EVENT_BYTES (or not text)."""


class SSEDecoder:
    """Feed bytes as they arrive; get back the data of each complete event, in order."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buffer = b""
        self._max = max_event_bytes

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data.replace(b"\r\n", b"\n")
        events: list[str] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            raw, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            payload = _data(raw)
            if payload is not None:
                events.append(payload)
        if len(self._buffer) > self._max:
            raise SSEFormatError(f"an event is larger than {self._max} bytes")
        return events


def _data(raw: bytes) -> str | None:
    """The joined `data:` lines of one event (None for comments and events without data)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SSEFormatError(f"an event is not UTF-8: {exc}") from exc
    lines = [line[5:].removeprefix(" ") for line in text.split("\n") if line.startswith("data:")]
    return "\n".join(lines) if lines else None
