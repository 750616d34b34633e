"""Which workers of a role stay when the planner changes how many it runs: growing takes the
lowest free indices; shrinking lets the least busy ones leave (requests in flight and queued;
ties: the highest index), so a scale-down drains the worker that empties first rather than
whichever has the highest index.

Owns that choice over plain data; never freezes or stops a worker (scaling.py does).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence


def kept_indices(current: Sequence[int], desired: int, busy: Mapping[int, int]) -> tuple[int, ...]:
    """The slot indices a role runs at `desired` workers, from `current`; `busy`: index ->
    requests in flight and queued on that worker (absent: none, e.g. not started yet)."""
    kept = sorted(set(current))
    free = (i for i in itertools.count() if i not in kept)
    kept += [next(free) for _ in range(desired - len(kept))]
    if len(kept) > desired:
        leaving = set(sorted(kept, key=lambda i: (busy.get(i, 0), -i))[: len(kept) - desired])
        kept = [i for i in kept if i not in leaving]
    return tuple(sorted(kept))
