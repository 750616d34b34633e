"""What a tool-call format is to the parsers that drive it: where a call region starts in the
output, and what of it has been written so far.

Owns the Protocol; never implements a format (llama3_json.py, glm_xml.py do).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from loom_runtime.wire.openai.chat.calls import FunctionCall, PartialCall

Schemas = Mapping[str, Mapping[str, Any]]
"""Function name -> its parameters' JSON schema (some formats type arguments by it)."""


class ToolFormat(Protocol):
    """A family's way of writing tool calls into its output text."""

    def region_start(self, text: str) -> int | None:
        """Where the calls begin in `text` (the content before them stays content); None while
        no call has begun."""
        ...

    def held_back(self, text: str) -> int:
        """How many trailing characters of `text` (which holds no call yet) may still become the
        start of one, so a stream must not send them as content yet."""
        ...

    def calls(self, region: str, schemas: Schemas) -> list[FunctionCall] | None:
        """The calls of a whole region; None when it is not well-formed calls."""
        ...

    def partial(self, region: str, schemas: Schemas) -> list[PartialCall]:
        """The calls of a region still being written, as far as they are settled."""
        ...


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
