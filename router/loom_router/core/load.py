"""Per-endpoint load: scraped engine metrics (with staleness) and the router's own in-flight count.

Owns the /metrics parser for the names the router reads and the load view it routes on; never
scrapes (the shell does) and never treats a stale or missing metric as zero load.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

from loom_router.errors import ConfigError, MetricsParseError
from loom_runtime.wire.metric_names import (
    ADMISSION_OPEN,
    KV_CACHE_USAGE,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    WEIGHTS_VERSION,
    info,
)

WEIGHTS_VERSION_INFO = info(WEIGHTS_VERSION)
_READ = frozenset(
    {
        NUM_REQUESTS_WAITING,
        NUM_REQUESTS_RUNNING,
        KV_CACHE_USAGE,
        WEIGHTS_VERSION_INFO,
        ADMISSION_OPEN,
    }
)


@dataclass(frozen=True)
class EngineMetrics:
    """What one scrape said. None means the metric was absent (unknown, not zero).

    Several series of one name (a vLLM server over several engines) are summed for request
    counts and averaged for KV usage.
    """

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    """Fraction of KV blocks in use, 0..1."""
    weights_version: str | None = None
    admission_open: bool | None = None


def parse_metrics(text: str) -> EngineMetrics:
    """The router's metrics from Prometheus exposition text; MetricsParseError if malformed."""
    values: dict[str, list[float]] = {name: [] for name in _READ}
    versions: list[str] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in _READ or math.isnan(sample.value):
                    continue
                values[sample.name].append(float(sample.value))
                if sample.name == WEIGHTS_VERSION_INFO and "version" in sample.labels:
                    versions.append(sample.labels["version"])
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsParseError(f"not Prometheus text exposition: {exc}") from exc
    usage = values[KV_CACHE_USAGE]
    admission = values[ADMISSION_OPEN]
    return EngineMetrics(
        waiting=sum(values[NUM_REQUESTS_WAITING]) if values[NUM_REQUESTS_WAITING] else None,
        running=sum(values[NUM_REQUESTS_RUNNING]) if values[NUM_REQUESTS_RUNNING] else None,
        kv_usage=min(1.0, max(0.0, sum(usage) / len(usage))) if usage else None,
        # Two versions in one scrape (engines of one server mid-sync): unknown.
        weights_version=versions[0] if len(set(versions)) == 1 else None,
        admission_open=all(v > 0 for v in admission) if admission else None,
    )


@dataclass(frozen=True)
class LoadView:
    """Load of every endpoint at one moment: fresh scrapes only, plus the router's in-flight.

    An endpoint without a fresh scrape has `metrics(id) is None`: unknown. Scorers give it
    their lowest score and the hot-spot rule falls back on the router's own count.
    """

    fresh: Mapping[str, EngineMetrics]
    in_flight: Mapping[str, int]

    def metrics(self, endpoint_id: str) -> EngineMetrics | None:
        return self.fresh.get(endpoint_id)

    def in_flight_of(self, endpoint_id: str) -> int:
        return self.in_flight.get(endpoint_id, 0)

    def load(self, endpoint_id: str) -> float:
        """Requests on the endpoint: the larger of the router's own in-flight count and the
        engine's running + waiting (which also counts other router replicas' requests)."""
        own = float(self.in_flight.get(endpoint_id, 0))
        m = self.fresh.get(endpoint_id)
        if m is None or (m.running is None and m.waiting is None):
            return own
        return max(own, (m.running or 0.0) + (m.waiting or 0.0))


def load_view(
    fresh: Mapping[str, EngineMetrics] | None = None, in_flight: Mapping[str, int] | None = None
) -> LoadView:
    """A LoadView over copies of plain mappings (tests, benches, a shell without a tracker)."""
    return LoadView(MappingProxyType(dict(fresh or {})), MappingProxyType(dict(in_flight or {})))


class LoadTracker:
    """The mutable owner of scrape results and in-flight counts; `view(now)` freezes them.

    Thread-safe (one lock). Bounded: it only holds endpoints it was told about, and `forget`
    drops one (call it when the endpoint leaves the snapshot). Times are the caller's clock
    (time.monotonic in the shell), so tests pass explicit values.
    """

    def __init__(self, stale_after_s: float = 2.0) -> None:
        if stale_after_s <= 0:
            raise ConfigError(f"stale_after_s must be > 0, got {stale_after_s}")
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._scrapes: dict[str, tuple[float, EngineMetrics]] = {}
        self._in_flight: dict[str, int] = {}

    def record_scrape(self, endpoint_id: str, metrics: EngineMetrics, at: float) -> None:
        with self._lock:
            previous = self._scrapes.get(endpoint_id)
            if previous is None or previous[0] <= at:  # a late, older answer never wins
                self._scrapes[endpoint_id] = (at, metrics)

    def record_scrape_failure(self, endpoint_id: str) -> None:
        """The scrape failed: its load is unknown from now on (not the last value, not zero)."""
        with self._lock:
            self._scrapes.pop(endpoint_id, None)

    def begin(self, endpoint_id: str) -> None:
        """The router sent a request to the endpoint."""
        with self._lock:
            self._in_flight[endpoint_id] = self._in_flight.get(endpoint_id, 0) + 1

    def end(self, endpoint_id: str) -> None:
        """A request the router sent there finished (in any way). Never goes below zero."""
        with self._lock:
            count = self._in_flight.get(endpoint_id, 0) - 1
            if count > 0:
                self._in_flight[endpoint_id] = count
            else:
                self._in_flight.pop(endpoint_id, None)

    def forget(self, endpoint_ids: Iterable[str]) -> None:
        with self._lock:
            for endpoint_id in endpoint_ids:
                self._scrapes.pop(endpoint_id, None)
                self._in_flight.pop(endpoint_id, None)

    def view(self, now: float) -> LoadView:
        """The load as of `now`: scrapes older than `stale_after_s` are left out (unknown)."""
        horizon = now - self.stale_after_s
        with self._lock:
            fresh = {eid: m for eid, (at, m) in self._scrapes.items() if at >= horizon}
            in_flight = dict(self._in_flight)
        return LoadView(MappingProxyType(fresh), MappingProxyType(in_flight))
