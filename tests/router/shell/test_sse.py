"""SSE framing: events split anywhere across reads come out whole, in order."""

from __future__ import annotations

import pytest

from loom_router.shell.sse import SSEDecoder, SSEFormatError
from loom_runtime.wire.openai.sse import encode


def test_events_split_across_reads_are_joined() -> None:
    wire = encode({"a": 1}) + b": a comment\n\n" + encode("[DONE]")
    for cut in range(1, len(wire)):
        decoder = SSEDecoder()
        out = decoder.feed(wire[:cut]) + decoder.feed(wire[cut:])
        assert out == ['{"a":1}', "[DONE]"], cut


def test_multi_line_data_and_crlf() -> None:
    assert SSEDecoder().feed(b"data: x\r\ndata:y\r\n\r\n") == ["x\ny"]


def test_an_event_larger_than_the_bound_is_refused() -> None:
    decoder = SSEDecoder(max_event_bytes=8)
    with pytest.raises(SSEFormatError):
        decoder.feed(b"data: 0123456789")
