"""The operator's own Prometheus metrics: the planner's (control/planner_metrics.py), the Kube API
requests it sent by verb, its fleet rounds, the cards waiting for a look (its queue) and the card
shards it holds, served on `loom operator --metrics-port`.

Owns the metric names and their registry (one per operator process, carried in kopf's memo);
never decides anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from loom_operator.control.planner_metrics import PlannerMetrics

KUBE_REQUESTS = "loom:operator_kube_requests"
FLEET_ROUNDS = "loom:operator_fleet_rounds"
QUEUE = "loom:operator_cards_waiting"
SHARDS = "loom:operator_shards_held"


class RequestsByVerb(Collector):
    """The Kube client's own tally of requests sent by HTTP method, read at each scrape."""

    def __init__(self, requests: Mapping[str, int]) -> None:
        self._requests = requests

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            KUBE_REQUESTS, "Kube API requests the operator sent, by HTTP verb (a watch is a GET)",
            labels=("verb",),
        )  # fmt: skip
        for verb, n in sorted(dict(self._requests).items()):
            family.add_metric((verb,), float(n))
        yield family


class OperatorMetrics(PlannerMetrics):
    """The planner's metrics and the operator's own, in one registry."""

    def __init__(self) -> None:
        super().__init__()
        self._rounds = Counter(
            FLEET_ROUNDS, "Fleet rounds run, by namespace and whether they acted on workers",
            ("namespace", "acted"), registry=self.registry,
        )  # fmt: skip

    def kube_requests(self, requests: Mapping[str, int]) -> None:
        """Export the Kube client's request tally (`Kube.requests`) by verb."""
        self.registry.register(RequestsByVerb(requests))

    def queue(self, pending: Callable[[], int]) -> None:
        """Export the cards woken by a watch whose loop has not looked yet."""
        gauge = Gauge(QUEUE, "Cards a watch woke whose card loop has not looked yet",
                      registry=self.registry)  # fmt: skip
        gauge.set_function(lambda: float(pending()))

    def shards(self, held: Callable[[], int]) -> None:
        """Export how many card shards this replica acts on (sharded operators)."""
        gauge = Gauge(SHARDS, "Card shards this operator replica holds and acts on",
                      registry=self.registry)  # fmt: skip
        gauge.set_function(lambda: float(held()))

    def round_done(self, namespace: str, acted: bool) -> None:
        self._rounds.labels(namespace, "true" if acted else "false").inc()

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Serve /metrics on `address:port` from a daemon thread."""
        start_http_server(port, addr=address, registry=self.registry)
