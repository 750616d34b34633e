"""A streamed completion with a behaviour record, read on a thread: what the push tests hold
open across a weights swap to see which version sampled each token.

Owns the reading of one SSE stream; never judges what it read.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any


class RecordStream:
    """POST `doc` (a streamed completion asking for `return_behaviour`) to `url`; its response
    headers, its chunks' choices as they come, and an event set once its first token has
    arrived."""

    def __init__(self, url: str, doc: dict[str, Any]) -> None:
        self.headers: dict[str, str] = {}
        self.choices: list[dict[str, Any]] = []
        self.first_token = threading.Event()
        self.error: BaseException | None = None
        self._req = urllib.request.Request(
            url, data=json.dumps({**doc, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        try:
            with urllib.request.urlopen(self._req, timeout=300) as resp:
                self.headers = {k.lower(): v for k, v in resp.headers.items()}
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for choice in json.loads(line[6:]).get("choices", []):
                        self.choices.append(choice)
                        if choice.get("token_ids"):
                            self.first_token.set()
        except BaseException as exc:
            self.error = exc
        finally:
            self.first_token.set()

    def result(self) -> tuple[list[int], list[dict[str, Any]], str | None]:
        """(token ids, weight_versions, finish_reason) once the stream has ended."""
        self.thread.join(300)
        assert not self.thread.is_alive() and self.error is None, self.error
        ids = [t for c in self.choices for t in c.get("token_ids") or []]
        spans = [c["weight_versions"] for c in self.choices if "weight_versions" in c]
        return ids, spans[-1], self.choices[-1].get("finish_reason")
