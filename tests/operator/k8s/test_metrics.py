"""The operator's own metrics: Kube API requests by verb (read from the client's tally at each
scrape), fleet rounds and the cards waiting for a look."""

from __future__ import annotations

from collections import Counter

from prometheus_client import generate_latest

from loom_operator.k8s.metrics import OperatorMetrics


def test_requests_by_verb_rounds_and_the_queue_are_exported() -> None:
    metrics, requests, waiting = OperatorMetrics(), Counter[str](), [0]
    metrics.kube_requests(requests)
    metrics.queue(lambda: waiting[0])
    requests["GET"] += 3
    requests["PATCH"] += 1
    metrics.round_done("ns", acted=True)
    waiting[0] = 2
    text = generate_latest(metrics.registry).decode()
    assert 'loom:operator_kube_requests_total{verb="GET"} 3.0' in text
    assert 'loom:operator_kube_requests_total{verb="PATCH"} 1.0' in text
    assert 'loom:operator_fleet_rounds_total{acted="true",namespace="ns"} 1.0' in text
    assert "loom:operator_cards_waiting 2.0" in text
    requests["GET"] += 1  # read at each scrape, not copied once
    assert 'verb="GET"} 4.0' in generate_latest(metrics.registry).decode()
