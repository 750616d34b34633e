"""The router's Prometheus metrics (`loom_router:*`): counters it bumps, gauges read at scrape time.

Owns names, labels and forgetting an endpoint's series when it leaves (so the registry is
bounded by the endpoints known now); never decides anything it counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import get_args

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loom_router.shell.pd_flow import FallbackReason
from loom_runtime.wire.metric_names import (
    ROUTER_MARKED_DOWN,
    ROUTER_MIGRATIONS,
    ROUTER_PD,
    ROUTER_PD_FALLBACKS,
    ROUTER_PICK_SECONDS,
    ROUTER_PREFIX,
    ROUTER_REQUESTS,
    ROUTER_ROUTED,
    ROUTER_TIME_TO_FIRST_TOKEN,
    ROUTER_UPSTREAM_ERRORS,
)
from loom_runtime.wire.pd import PDMode

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
P = ROUTER_PREFIX

# name -> (help, label names); every counter the shell bumps is declared here.
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    ROUTER_REQUESTS: ("Client requests answered, by route and status.", ("route", "code")),
    ROUTER_ROUTED: ("Requests sent to an endpoint, by why it won.", ("endpoint", "reason")),
    ROUTER_MIGRATIONS: (
        "Requests moved to another worker, by outcome (resumed: a stream continued; "
        "restarted: sent again from the start; exhausted, no_endpoint: failed).",
        ("outcome",),
    ),
    ROUTER_PD: ("Requests by how their prompt was prefilled.", ("mode",)),
    ROUTER_PD_FALLBACKS: ("Remote prefills that failed; decode prefilled locally.", ("reason",)),
    ROUTER_UPSTREAM_ERRORS: ("Failed calls to workers, by kind.", ("endpoint", "kind")),
    ROUTER_MARKED_DOWN: ("Endpoints the router took out of routing.", ("endpoint", "cause")),
    "scrape_failures": ("Failed /metrics scrapes.", ("endpoint",)),
    "kv_batches": ("KV-event batches applied to the prefix index.", ("endpoint", "source")),
    "kv_gaps": ("KV-event sequence gaps or restarts seen.", ("endpoint",)),
    "kv_replays": ("KV-event replays asked for, by outcome.", ("endpoint", "outcome")),
    "kv_decode_errors": ("KV-event messages dropped as malformed.", ("endpoint",)),
    "client_disconnects": ("Clients that left before their answer ended.", ()),
}

# Label values known in advance start at 0 (Prometheus' "avoid missing metrics"), so a
# dashboard's rate() over them reads 0 before the first event instead of "no data".
KNOWN: dict[str, tuple[tuple[str, ...], ...]] = {
    ROUTER_MIGRATIONS: (("resumed",), ("restarted",), ("exhausted",), ("no_endpoint",)),
    ROUTER_PD: tuple((m,) for m in get_args(PDMode)),
    ROUTER_PD_FALLBACKS: tuple((r,) for r in (*get_args(FallbackReason), "unknown")),
}
# The same for each endpoint, from when the router first sees it until it leaves.
PER_ENDPOINT: dict[str, tuple[str, ...]] = {
    ROUTER_ROUTED: ("prefix", "session", "load", "spill", "migration", "cost"),
    ROUTER_UPSTREAM_ERRORS: ("refused", "broken"),
    ROUTER_MARKED_DOWN: ("refused", "probe"),
}

GaugeSource = Callable[[], Iterable[tuple[tuple[str, ...], float]]]


@dataclass(frozen=True)
class GaugeSpec:
    name: str
    help: str
    labels: tuple[str, ...]
    read: GaugeSource
    counter: bool = False
    """A count kept elsewhere (e.g. index evictions), exposed as a counter."""


class RouterMetrics(Collector):
    """Counters in plain dicts (one lock) plus gauges computed from live state when scraped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[tuple[str, ...], float]] = {
            n: dict.fromkeys(KNOWN.get(n, ()), 0.0) for n in COUNTERS
        }
        self._gauges: list[GaugeSpec] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.ttft = Histogram(
            P + ROUTER_TIME_TO_FIRST_TOKEN,
            "Client-observed time to the first streamed chunk (or the full answer).",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.overhead = Histogram(
            P + ROUTER_PICK_SECONDS,
            "Time from a request's arrival to its endpoint: reading the body, tokenizing, "
            "hashing, any wait for paused capacity (a Barrier sync) and the pick.",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1, 10, 60),
            registry=self.registry,
        )
        self.registry.register(self)
        ProcessCollector(registry=self.registry)  # process_start_time_seconds: restarts show

    def inc(self, name: str, *labels: str, value: float = 1.0) -> None:
        if len(labels) != len(COUNTERS[name][1]):
            raise ValueError(f"{name} takes labels {COUNTERS[name][1]}, got {labels}")
        with self._lock:
            table = self._counts[name]
            table[labels] = table.get(labels, 0.0) + value

    def value(self, name: str, *labels: str) -> float:
        with self._lock:
            return self._counts[name].get(labels, 0.0)

    def total(self, name: str) -> float:
        with self._lock:
            return sum(self._counts[name].values())

    def add_gauge(
        self,
        name: str,
        help: str,
        labels: tuple[str, ...],
        read: GaugeSource,
        counter: bool = False,
    ) -> None:
        """A value read from live state at every scrape."""
        self._gauges.append(GaugeSpec(name, help, labels, read, counter))

    def know_endpoint(self, endpoint_id: str) -> None:
        """Start the endpoint's known series at 0 (those already counting are kept)."""
        with self._lock:
            for name, values in PER_ENDPOINT.items():
                table = self._counts[name]
                for value in values:
                    table.setdefault((endpoint_id, value), 0.0)

    def forget_endpoint(self, endpoint_id: str) -> None:
        """Drop every counter series labelled with this endpoint."""
        with self._lock:
            for name, (_, labels) in COUNTERS.items():
                if "endpoint" in labels:
                    at = labels.index("endpoint")
                    table = self._counts[name]
                    for key in [k for k in table if k[at] == endpoint_id]:
                        del table[key]

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshot = {n: dict(t) for n, t in self._counts.items()}
        for name, (text, labels) in COUNTERS.items():
            family = CounterMetricFamily(P + name, text, labels=list(labels))
            for key, value in sorted(snapshot[name].items()):
                family.add_metric(list(key), value)
            yield family
        for spec in self._gauges:
            kind = CounterMetricFamily if spec.counter else GaugeMetricFamily
            out = kind(P + spec.name, spec.help, labels=list(spec.labels))
            for key, value in spec.read():
                out.add_metric(list(key), value)
            yield out
