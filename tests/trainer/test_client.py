"""The trainer's client against a controller that is not ready for the card yet: a 503 with
Retry-After (a sharded operator's shard moving) is waited out within RETRY_WINDOW_S; any other
refusal, or a 503 past the window, is a PushRefused with the controller's words."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loom_trainer import client
from loom_trainer.client import WeightSync
from loom_trainer.errors import PushRefused


class Controller(BaseHTTPRequestHandler):
    """A stand-in controller: answers 503 (Retry-After: 0) `busy` times, then its latest push."""

    busy = 0
    calls = 0

    def do_GET(self) -> None:
        type(self).calls += 1
        refused = {"error": "shard moving; retry shortly"}
        status, doc = (503, refused) if self.calls <= self.busy else (200, {"update": None})
        body = json.dumps(doc).encode()
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def controller() -> Iterator[str]:
    Controller.calls = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Controller)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_503_is_waited_out(controller: str) -> None:
    Controller.busy = 3
    assert WeightSync.connect(controller, "t").latest() is None
    assert Controller.calls == 5  # three 503s, the connect's answer, the latest's


def test_a_503_past_the_window_is_refused(controller: str, monkeypatch: pytest.MonkeyPatch) -> None:
    Controller.busy = 10**6
    monkeypatch.setattr(client, "RETRY_WINDOW_S", 0.0)
    with pytest.raises(PushRefused, match="shard moving; retry shortly"):
        WeightSync.connect(controller, "t")
