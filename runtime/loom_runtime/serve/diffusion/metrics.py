"""Prometheus metrics of a diffusion worker: vLLM's request gauges (so the router's queue scorer
reads it unchanged) plus `loom:diffusion_*` and the step cost model's `loom:step_cost_*`, one
registry.

Owns the diffusion metric names; never uses the global registry, never times requests itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from loom_runtime.diffusion.engine_types import COMPONENTS, DiffusionStats
from loom_runtime.diffusion.step_cost import KindCost
from loom_runtime.serve.metrics import model_families
from loom_runtime.wire.metric_names import (
    ADMISSION_OPEN,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
)

logger = logging.getLogger(__name__)


class DiffusionStatsSource(Protocol):
    def stats(self) -> DiffusionStats: ...


class _DiffusionCollector(Collector):
    def __init__(self, model_name: str, source: DiffusionStatsSource) -> None:
        self._model, self._source = model_name, source

    def collect(self) -> Iterator[Metric]:
        try:
            s = self._source.stats()
        except Exception:
            logger.exception("diffusion stats unavailable; scrape has no engine metrics")
            return
        m = [self._model]
        gauge, counter = model_families(self._model)

        yield gauge(NUM_REQUESTS_RUNNING, "Requests in the running batch.", s.num_running)
        yield gauge(NUM_REQUESTS_WAITING, "Requests waiting for memory.", s.num_waiting)
        yield gauge(ADMISSION_OPEN, "1 when new requests are admitted.", s.admission_open)
        yield gauge(
            "loom:diffusion_memory_reserved_bytes",
            "Estimated peak bytes reserved by running diffusion requests.",
            s.memory_reserved_bytes,
        )
        yield gauge(
            "loom:diffusion_memory_budget_bytes",
            "What running diffusion requests' peaks may add up to.",
            s.memory_budget_bytes,
        )
        yield counter(
            "loom:diffusion_denoise_steps", "Denoise steps run (one per request).", s.denoise_steps
        )
        yield counter("loom:diffusion_engine_steps", "Batched engine steps run.", s.engine_steps)
        yield counter("loom:diffusion_requests_finished", "Completed.", s.requests_finished)
        yield counter(
            "loom:diffusion_requests_aborted", "Cancelled or aborted.", s.requests_aborted
        )
        yield counter("loom:text_cache_hits", "Prompt rows found encoded.", s.text_cache_hits)
        yield counter("loom:text_cache_misses", "Prompt rows encoded.", s.text_cache_misses)
        yield gauge("loom:text_cache_entries", "Encoded prompt rows kept.", s.text_cache_entries)
        yield gauge(
            "loom:step_predicted_seconds",
            "Predicted seconds of the running requests' next denoise step.",
            s.predicted_step_s,
        )
        yield from step_cost_families(self._model, s.step_costs)
        info = InfoMetricFamily(
            "loom:component_weights_version", "Weights version per component.",
            labels=["model_name", "component"],
        )  # fmt: skip
        for name in COMPONENTS:
            info.add_metric([*m, name], {"version": s.versions.get(name)})
        yield info


def step_cost_families(model_name: str, costs: Iterable[KindCost]) -> Iterator[Metric]:
    """The step cost model's fit per kind: seconds per item and fixed, and forwards measured."""
    labels = ["model_name", "kind"]
    per_item = GaugeMetricFamily(
        "loom:step_cost_seconds",
        "Predicted seconds per batch row of one forward, by kind (the online step cost model).",
        labels=labels,
    )
    fixed = GaugeMetricFamily(
        "loom:step_cost_fixed_seconds",
        "Predicted fixed seconds of one forward, by kind (the online step cost model).",
        labels=labels,
    )
    samples = CounterMetricFamily(
        "loom:step_cost_samples", "Forwards measured into the step cost model.", labels=labels
    )
    for c in costs:
        per_item.add_metric([model_name, c.kind], c.cost.per_item_s)
        fixed.add_metric([model_name, c.kind], c.cost.fixed_s)
        samples.add_metric([model_name, c.kind], c.samples)
    yield from (per_item, fixed, samples)


class DiffusionMetrics:
    """The diffusion worker's registry: engine snapshots at scrape time."""

    def __init__(self, model_name: str, source: DiffusionStatsSource) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(_DiffusionCollector(model_name, source))
        ProcessCollector(registry=self.registry)

    def render(self) -> bytes:
        """The exposition text. Reads engine stats: call it off the event loop."""
        return generate_latest(self.registry)
