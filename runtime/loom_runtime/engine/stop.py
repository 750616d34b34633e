"""Stop-string matching on detokenized text, and how much text streaming must hold back.

Pure string functions; never sees tokens, tensors or request state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    """A stop string found in the text: text[start:end] is it."""

    start: int
    end: int


def find_stop(text: str, stops: Sequence[str], searched: int) -> StopMatch | None:
    """The earliest stop string in `text` (the first listed of those starting there), or None.

    `searched` is how much of `text` was already checked on an earlier call: only matches
    that end after it can be new, so the scan starts just far enough back to catch a stop
    string that straddles old and new text.
    """
    best: StopMatch | None = None
    for stop in stops:
        if not stop:
            continue
        start = max(0, searched - len(stop) + 1)
        at = text.find(stop, start)
        if at != -1 and (best is None or at < best.start):
            best = StopMatch(at, at + len(stop))
    return best


def holdback(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string.

    Streaming sends everything but that suffix: those characters may turn out to be the
    start of a stop string, which is trimmed from the output.
    """
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest
