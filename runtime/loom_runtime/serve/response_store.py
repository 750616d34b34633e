"""The worker's stored responses (/v1/responses with store true): what `previous_response_id`
continues and GET /v1/responses/{id} returns, the last CAPACITY of them.

Owns the bound (the oldest goes first) and the lookup's error; never builds a response.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from loom_runtime.serve.errors import ResponseNotFoundError
from loom_runtime.wire.openai.responses.request import ChatMessageDict

CAPACITY = 1024


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as returned
    conversation: tuple[ChatMessageDict, ...]  # its turns and its output (no instructions)


class ResponseStore:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._kept[response_id] = stored
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse:
        found = self._kept.get(response_id)
        if found is None:
            raise ResponseNotFoundError(
                f"no stored response {response_id!r} on this worker (it keeps the last "
                f"{self.capacity}; one sent with store false is not kept)"
            )
        return found
