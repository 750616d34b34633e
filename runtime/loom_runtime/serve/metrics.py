"""Prometheus metrics of one worker: vLLM's names (REFERENCE.md §C) plus `loom:*`, one registry.

Owns metric names and buckets; never uses the global registry, never times requests itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from loom_runtime.control_api.status import PHASES, PhaseName, drain_phase
from loom_runtime.engine.types import EngineStats, RequestMetrics
from loom_runtime.wire import metric_names as names

logger = logging.getLogger(__name__)

# vLLM's buckets, so dashboards built for vLLM read Loom unchanged.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def worker_phase(admission_open: bool, in_flight: int, kv_leases: int) -> PhaseName:
    """The worker's own view of a weight sync's freeze → drain → load → resume: the drain rule,
    with a prefill's KV leases awaiting a pull counted as work left."""
    return drain_phase(admission_open, bool(in_flight or kv_leases))


class StatsSource(Protocol):
    """What the metrics read from the engine (the Engine satisfies it)."""

    def stats(self) -> EngineStats: ...

    def in_flight(self) -> int: ...


def model_families(
    model_name: str,
) -> tuple[
    Callable[[str, str, float], GaugeMetricFamily], Callable[[str, str, float], CounterMetricFamily]
]:
    """Builders of one-sample gauge and counter families labelled with the model's name (for
    collectors that read a stats snapshot at scrape time)."""

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([model_name], value)
        return g

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([model_name], value)
        return c

    return gauge, counter


def _hisparse_metrics(
    s: EngineStats,
    gauge: Callable[[str, str, float], GaugeMetricFamily],
    counter: Callable[[str, str, float], CounterMetricFamily],
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Hybrid HiSparse decode's figures (all 0 when it is off; docs/hisparse.md)."""
    looked_up = s.hisparse_hot_hits + s.hisparse_hot_misses
    yield gauge(
        "loom:hisparse_host_pool_bytes",
        "Bytes of the HiSparse host pool of latent KV rows and keys (0: HiSparse off).",
        s.hisparse_host_pool_bytes,
    )
    yield gauge(
        "loom:hisparse_hot_hit_rate",
        "Fraction of decode-selected earlier rows found in the hot buffer (since start).",
        s.hisparse_hot_hits / looked_up if looked_up else 0.0,
    )
    yield counter(
        "loom:hisparse_hot_hits", "Decode-selected rows found in a hot buffer.", s.hisparse_hot_hits
    )
    yield counter(
        "loom:hisparse_hot_misses",
        "Decode-selected rows copied in from the host pool.",
        s.hisparse_hot_misses,
    )
    yield counter(
        "loom:hisparse_h2d_bytes",
        "Bytes copied host -> device for decode hot-buffer misses.",
        s.hisparse_h2d_bytes,
    )
    yield counter(
        "loom:hisparse_prefill_h2d_bytes",
        "Bytes copied host -> device for one prefill step each (not kept).",
        s.hisparse_prefill_h2d_bytes,
    )
    yield counter(
        "loom:hisparse_keys_h2d_bytes",
        "Bytes of pulled or reloaded blocks' indexer keys copied host -> device.",
        s.hisparse_keys_h2d_bytes,
    )
    yield gauge(
        "loom:hisparse_hot_requests", "Requests holding a hot buffer.", s.hisparse_hot_requests
    )


RANK_GAUGES = (
    ("loom:rank_kv_tokens", "Tokens whose KV rows this rank holds (a DCP rank: its share).",
     "kv_tokens"),
    ("loom:rank_kv_bytes", "Bytes of the KV blocks this rank's rows fill.", "kv_bytes"),
    ("loom:rank_kv_bytes_per_token",
     "KV bytes of one token's rows where a rank keeps them (all layers).", "kv_bytes_per_token"),
    ("loom:rank_sequences", "Live sequences on this rank.", "sequences"),
    ("loom:rank_kv_device_bytes",
     "HiSparse ranks: device bytes of their sequences' indexer keys and hot buffers.",
     "device_kv_bytes"),
)  # fmt: skip


def _rank_metrics(s: EngineStats, model_name: str) -> Iterator[GaugeMetricFamily]:
    """A parallel engine's per-rank KV (none on one rank; docs/parallel.md)."""
    if not s.ranks:
        return
    for name, doc, field in RANK_GAUGES:
        g = GaugeMetricFamily(name, doc, labels=["model_name", "rank"])
        for rank in s.ranks:
            g.add_metric([model_name, str(rank.rank)], getattr(rank, field))
        yield g


def _spec_metrics(
    s: EngineStats, model_name: str, counter: Callable[[str, str, float], CounterMetricFamily]
) -> Iterator[CounterMetricFamily]:
    """MTP speculation's counters under vLLM's names (none when speculation is off)."""
    spec = s.spec
    if spec is None:
        return
    yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", spec.num_drafts)
    yield counter(
        "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", spec.num_draft_tokens
    )
    yield counter(
        "vllm:spec_decode_num_accepted_tokens",
        "Number of accepted tokens.",
        spec.num_accepted_tokens,
    )
    per_pos = CounterMetricFamily(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        labels=["model_name", "position"],
    )
    for position, accepted in enumerate(spec.accepted_per_pos):
        per_pos.add_metric([model_name, str(position)], accepted)
    yield per_pos


class _EngineCollector(Collector):
    """Reads one EngineStats snapshot per scrape: gauges and the engine's own counters."""

    def __init__(self, model_name: str, source: StatsSource) -> None:
        self._model = model_name
        self._source = source

    def collect(self) -> Iterator[Metric]:
        try:
            s = self._source.stats()
            in_flight = self._source.in_flight()
        except Exception:
            logger.exception("engine stats unavailable; scrape has no engine metrics")
            return
        m = [self._model]
        gauge, counter = model_families(self._model)

        yield gauge(names.NUM_REQUESTS_RUNNING, "Requests in the running batch.", s.num_running)
        yield gauge(names.NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", s.num_waiting)
        yield gauge(names.KV_CACHE_USAGE, "Fraction of KV blocks in use (0..1).", s.kv_usage)
        yield counter(names.PREFIX_CACHE_QUERIES, "Prompt tokens looked up.", s.prefix_queries)
        yield counter(names.PREFIX_CACHE_HITS, "Prompt tokens found cached.", s.prefix_hits)
        yield counter("vllm:num_preemptions", "Requests preempted.", s.num_preemptions)
        yield counter(names.PROMPT_TOKENS, "Prompt tokens prefilled.", s.num_prompt_tokens)
        yield counter(
            names.PROMPT_TOKENS_ARRIVED,
            "Prompt tokens of requests as they arrive, scheduled or not (the offered load).",
            s.num_prompt_tokens_arrived,
        )
        yield counter(names.GENERATION_TOKENS, "Tokens generated.", s.num_generation_tokens)
        yield gauge(names.ADMISSION_OPEN, "1 when new requests are admitted.", s.admission_open)
        yield gauge(names.IN_FLIGHT_REQUESTS, "Requests admitted, not finished.", in_flight)
        yield gauge(
            names.PREFILL_BACKLOG_TOKENS,
            "Prompt tokens of queued and running requests not computed yet.",
            s.prefill_backlog_tokens,
        )
        yield gauge(names.KV_FREE_BLOCKS, "KV blocks free or evictable.", s.num_free_blocks)
        yield gauge("loom:kv_cache_bytes", "Bytes of this rank's KV pool.", s.kv_cache_bytes)
        yield gauge(
            "loom:kv_bytes_per_token",
            "KV bytes one cached token costs on this rank (all layers): the planner's figure.",
            s.kv_bytes_per_token,
        )
        yield gauge(names.KV_LEASES, "Prefill KV leases awaiting a decode's pull.", s.num_kv_leases)
        yield gauge(names.KV_PULLS_IN_FLIGHT, "Decode requests awaiting their KV.", s.num_kv_pulls)
        yield counter(names.KV_EXPIRED, "KV leases that expired unpulled.", s.kv_expired)
        yield counter(names.KV_TRANSFER_FAILURES, "KV pulls that failed.", s.kv_transfer_failures)
        yield counter(names.KV_PULLED_TOKENS, "Prompt tokens pulled.", s.kv_pulled_tokens)
        yield counter(names.KV_PULLED_BYTES, "KV bytes pulled from prefills.", s.kv_pulled_bytes)
        yield gauge(
            "loom:kv_offload_capacity_bytes",
            "Bytes of the host KV tier (CPU KV offload; 0 when off).",
            s.kv_offload_capacity_bytes,
        )
        yield gauge(
            "loom:kv_offload_used_bytes",
            "Host KV tier bytes holding blocks.",
            s.kv_offload_used_bytes,
        )
        yield counter(
            "loom:kv_offloaded_blocks",
            "Evicted device KV blocks copied to the host tier.",
            s.kv_offloaded_blocks,
        )
        yield counter(
            "loom:kv_reload_tokens",
            "Prompt tokens reloaded from the host KV tier instead of recomputed.",
            s.kv_reload_tokens,
        )
        yield counter(
            "loom:kv_reload_bytes", "Bytes copied back from the host KV tier.", s.kv_reload_bytes
        )
        yield from _hisparse_metrics(s, gauge, counter)
        yield from _rank_metrics(s, self._model)
        yield from _spec_metrics(s, self._model, counter)
        yield counter(names.DRAINS, "Drains completed (admission closed until idle).", s.drains)
        yield counter(names.DRAIN_SECONDS, "Seconds the completed drains took.", s.drain_seconds)
        yield gauge(names.LAST_DRAIN_SECONDS, "The latest drain's duration.", s.last_drain_seconds)
        phase = GaugeMetricFamily(
            names.WORKER_PHASE,
            "1 for the worker's phase now: serving (admission open), draining (closed, work "
            "left), paused (closed and idle: ready for LoadWeights).",
            labels=["model_name", "phase"],
        )
        now = worker_phase(s.admission_open, in_flight, s.num_kv_leases)
        for name in PHASES:
            phase.add_metric([*m, name], float(name == now))
        yield phase
        info = InfoMetricFamily(
            names.WEIGHTS_VERSION, "Weights version served.", labels=["model_name"]
        )
        info.add_metric(m, {"version": s.weights_version})
        yield info
        cache = InfoMetricFamily("vllm:cache_config", "KV cache config.", labels=["model_name"])
        cache.add_metric(m, {"block_size": str(s.block_size), "num_gpu_blocks": str(s.num_blocks)})
        yield cache


class ServerMetrics:
    """The worker's registry: engine snapshots at scrape time, request latencies at finish."""

    def __init__(self, model_name: str, source: StatsSource) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        reg, labels = self.registry, ["model_name"]

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=reg, buckets=buckets)

        self.request_success = Counter(
            names.REQUEST_SUCCESS, "Finished requests.", [*labels, "finished_reason"], registry=reg
        )
        self.ttft = hist(names.TIME_TO_FIRST_TOKEN, "Time to first token.", TTFT_BUCKETS)
        self.itl = hist(names.INTER_TOKEN_LATENCY, "Inter-token latency.", ITL_BUCKETS)
        self.e2e = hist(names.E2E_REQUEST_LATENCY, "Request latency.", REQUEST_BUCKETS)
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Time before first scheduled.",
            REQUEST_BUCKETS,
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds", "Time in prefill.", REQUEST_BUCKETS
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds", "First to last token.", REQUEST_BUCKETS
        )
        self.registry.register(_EngineCollector(model_name, source))
        # process_start_time_seconds and friends: a restart shows as a new start time.
        ProcessCollector(registry=self.registry)

    def render(self) -> bytes:
        """The exposition text. Reads engine stats: call it off the event loop."""
        return generate_latest(self.registry)

    def observe_finished(self, reason: str, m: RequestMetrics | None) -> None:
        """Count a finished request and observe its latencies (the engine timed them)."""
        name = self.model_name
        self.request_success.labels(name, reason).inc()
        if m is None:
            return
        self.e2e.labels(name).observe(m.e2e_latency)
        for value, hist in (
            (m.time_to_first_token, self.ttft),
            (m.queue_time, self.queue_time),
            (m.prefill_time, self.prefill_time),
            (m.decode_time, self.decode_time),
        ):
            if value is not None:
                hist.labels(name).observe(value)
        itl = self.itl.labels(name)
        for gap in m.inter_token_latencies:
            itl.observe(gap)
