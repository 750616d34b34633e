"""Process helpers the worker and the router share: the log line and signal-driven lifetime."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from loom_runtime.wire.process import LOG_FORMAT, ExtrasFormatter, serve_until_signalled


@pytest.mark.parametrize(
    ("extra", "tail"),
    [({}, "hello"), ({"request_id": "r1"}, "hello request_id=r1"),
     ({"a": 1, "b": "x y"}, "hello a=1 b=x y")],
)  # fmt: skip
def test_extras_follow_the_message_as_key_value(extra: dict[str, object], tail: str) -> None:
    record = logging.makeLogRecord({"msg": "hello", "levelname": "INFO", "name": "t", **extra})
    line = ExtrasFormatter(LOG_FORMAT).format(record)
    assert line.endswith(f"INFO t: {tail}")


class _Server:
    def __init__(self) -> None:
        self.events: list[str] = []

    async def start(self) -> None:
        self.events.append("start")
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

    async def stop(self) -> None:
        self.events.append("stop")


def test_a_signal_stops_the_server_gracefully(caplog: pytest.LogCaptureFixture) -> None:
    server = _Server()
    with caplog.at_level(logging.INFO):
        asyncio.run(serve_until_signalled(server, logging.getLogger("t"), "t stopping"))
    assert server.events == ["start", "stop"]
    assert "t stopping" in caplog.messages
