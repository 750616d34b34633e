"""SSE framing: one compact `data:` event per message, DONE as a literal."""

from __future__ import annotations

from typing import Any

import pytest

from loom_runtime.wire.openai.sse import DONE, encode


@pytest.mark.parametrize(
    ("data", "framed"),
    [
        ({"a": 1, "b": [1, 2]}, b'data: {"a":1,"b":[1,2]}\n\n'),
        (DONE, b"data: [DONE]\n\n"),
        ({"t": "é"}, b'data: {"t":"\\u00e9"}\n\n'),
        ({}, b"data: {}\n\n"),
    ],
)
def test_encode_frames_one_event(data: Any, framed: bytes) -> None:
    assert encode(data) == framed
