"""What bench/weight_push.py measures about one weight update and how it reports them: the
update's record, a worker's peak extra RSS while it runs, the serving pause the streaming clients
saw, and the markdown tables (medians over the rounds).

Owns the metrics' definitions; never starts a fleet or changes weights.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from broadcast_baseline import Baseline
from weight_push_memory import rss

from loom_operator.testing.load import Stream

SAMPLE_S = 0.005


@dataclass(frozen=True)
class Update:
    """One weight update as the bench saw it."""

    shape: str
    method: str
    workers: int
    loaded: bool
    """Under streaming load (the pause is measured) or quiet (the push's own rate)."""
    version: str
    seconds: float
    """Start → every worker ready and routed on the version (a checkpoint's writing included)."""
    write_s: float
    """Checkpoint: writing the directory (0 for a push)."""
    send_s: float
    """Push: first bucket → commit, the bytes moving (0 for a checkpoint)."""
    bytes: int
    peak_extra_rss: int
    """The largest over workers of (peak VmRSS during the update − VmRSS before)."""
    longest_gap_s: float = 0.0
    """Longest gap between two tokens of a stream, the gap overlapping the update."""
    longest_wait_s: float = 0.0
    """Longest time to first token of a request started during the update."""
    base_gap_s: float = 0.0
    base_wait_s: float = 0.0
    """The same two in the window of the same length before the update."""
    failed: int = 0
    mixed: int = 0
    """Streams overlapping the update that failed, or carried two versions."""


class PeakRss:
    """Samples the workers' VmRSS every SAMPLE_S while the block runs."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = list(pids)
        self._stop = threading.Event()
        self._base = {p: rss(p) for p in self._pids}
        self._peak = dict(self._base)
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for p in self._pids:
                try:
                    self._peak[p] = max(self._peak[p], rss(p))
                except OSError:  # a worker that exited: its last sample stands
                    continue
            self._stop.wait(SAMPLE_S)

    def extra(self) -> int:
        return int(max(self._peak[p] - self._base[p] for p in self._pids))


def _gaps(streams: Sequence[Stream], a: float, b: float) -> float:
    gaps = [
        y - x
        for s in streams
        for x, y in zip(s.token_times, s.token_times[1:], strict=False)
        if y > a and x < b
    ]
    return max(gaps, default=0.0)


def _waits(streams: Sequence[Stream], a: float, b: float) -> float:
    waits = [
        (s.first_token if s.first_token is not None else s.finished) - s.started
        for s in streams
        if a <= s.started < b
    ]
    return max(waits, default=0.0)


def pause(
    update: Update, streams: Sequence[Stream], t0: float, t1: float, before_s: float
) -> Update:
    """`update` with what the streams saw during [t0, t1] and in the same span before t0."""
    span = max(t1 - t0, before_s)
    during = [s for s in streams if s.started < t1 and s.finished > t0]
    return replace(
        update,
        longest_gap_s=_gaps(streams, t0, t1),
        longest_wait_s=_waits(streams, t0, t1),
        base_gap_s=_gaps(streams, t0 - span, t0),
        base_wait_s=_waits(streams, t0 - span, t0),
        failed=sum(1 for s in during if not s.ok),
        mixed=sum(1 for s in during if s.ok and len(s.versions) != 1),
    )


def _med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bandwidth_table(baselines: Sequence[Baseline], updates: Sequence[Update]) -> list[str]:
    """Per shape and world: the plain broadcast's rate and the quiet pushes' (median)."""
    lines = [
        "| shape | bytes | world | push | plain broadcast: tensor by tensor / packed | push: bytes "
        "moving / open → served | push ÷ plain broadcast (best) |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((u.shape, u.workers, u.method) for u in updates if not u.loaded)
    for shape, workers, method in keys:
        key = (shape, workers, method)
        quiet = [u for u in updates if (u.shape, u.workers, u.method) == key and not u.loaded]
        size = quiet[0].bytes
        base = next(b for b in baselines if b.world == workers + 1 and b.bytes == size)
        rate = _med([u.bytes / u.send_s for u in quiet])
        lines.append(
            f"| {shape} | {size / 1e6:.0f} MB | {workers + 1} | {method} | "
            f"{base.per_tensor_bps / 1e6:.0f} / "
            f"{base.packed_bps / 1e6:.0f} MB/s | {rate / 1e6:.0f} MB/s / "
            f"{_med([u.seconds for u in quiet]):.2f} s | {rate / base.best_bps:.0%} |"
        )
    return lines


def update_table(updates: Sequence[Update]) -> list[str]:
    lines = [
        "| shape | update | rounds | time (s) | MB/s | longest token gap (s), before → during | "
        "longest new-request wait (s), before → during | peak extra RSS (MB) | failed | mixed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((u.shape, u.method) for u in updates if u.loaded)
    for shape, method in keys:
        group = [u for u in updates if u.loaded and (u.shape, u.method) == (shape, method)]

        def med(field: str, group: Sequence[Update] = group) -> float:
            return _med([float(getattr(u, field)) for u in group])

        lines.append(
            f"| {shape} | {method} | {len(group)} | {med('seconds'):.2f} | "
            f"{_med([u.bytes / u.seconds for u in group]) / 1e6:.0f} | "
            f"{med('base_gap_s'):.2f} → {med('longest_gap_s'):.2f} | "
            f"{med('base_wait_s'):.2f} → {med('longest_wait_s'):.2f} | "
            f"{med('peak_extra_rss') / 1e6:.0f} | {sum(u.failed for u in group)} | "
            f"{sum(u.mixed for u in group)} |"
        )
    return lines


def summarize(baselines: Sequence[Baseline], updates: Sequence[Update]) -> str:
    return "\n".join([*bandwidth_table(baselines, updates), "", *update_table(updates)])
