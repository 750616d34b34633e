"""Worker metrics: vLLM names from engine snapshots, loom:* gauges, latencies, own registry."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from loom_runtime.control_api.status import PHASES
from loom_runtime.engine.types import EngineStats, RankKVStats, RequestMetrics, SpecDecodeStats
from loom_runtime.serve.metrics import ServerMetrics, worker_phase


class Snapshot:
    """A fixed stats source (the real engine is exercised by the server tests)."""

    def __init__(self, stats: EngineStats, in_flight: int) -> None:
        self._stats, self._in_flight = stats, in_flight

    def stats(self) -> EngineStats:
        return self._stats

    def in_flight(self) -> int:
        return self._in_flight


STATS = EngineStats(
    num_running=2, num_waiting=1, kv_usage=0.25, num_blocks=64, num_free_blocks=48,
    block_size=16, admission_open=False, weights_version="v7", num_preemptions=3,
    prefix_queries=100, prefix_hits=40, num_prompt_tokens=120, num_generation_tokens=33,
    num_prompt_tokens_arrived=150,
    num_kv_leases=1, kv_pulled_bytes=4096, drains=2, drain_seconds=3.5, last_drain_seconds=1.5,
    kv_cache_bytes=64 * 16 * 1024, kv_bytes_per_token=1024, prefill_backlog_tokens=700,
)  # fmt: skip


def _samples(m: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_engine_snapshot_is_exported_under_vllm_and_loom_names() -> None:
    s = _samples(ServerMetrics("tiny", Snapshot(STATS, in_flight=3)))
    m = (("model_name", "tiny"),)
    assert s[("vllm:num_requests_running", m)] == 2
    assert s[("vllm:num_requests_waiting", m)] == 1
    assert s[("vllm:kv_cache_usage_perc", m)] == 0.25
    assert s[("vllm:prefix_cache_queries_total", m)] == 100
    assert s[("vllm:prefix_cache_hits_total", m)] == 40
    assert s[("vllm:num_preemptions_total", m)] == 3
    assert s[("vllm:prompt_tokens_total", m)] == 120
    assert s[("loom:prompt_tokens_arrived_total", m)] == 150
    assert s[("vllm:generation_tokens_total", m)] == 33
    assert s[("loom:admission_open", m)] == 0
    assert s[("loom:in_flight_requests", m)] == 3
    assert s[("loom:prefill_backlog_tokens", m)] == 700
    assert s[("loom:kv_free_blocks", m)] == 48
    assert s[("loom:kv_cache_bytes", m)] == 64 * 16 * 1024
    assert s[("loom:kv_bytes_per_token", m)] == 1024
    assert s[("loom:weights_version_info", (("model_name", "tiny"), ("version", "v7")))] == 1
    assert s[("loom:kv_pulled_bytes_total", m)] == 4096
    assert s[("loom:drains_total", m)] == 2
    assert s[("loom:drain_seconds_total", m)] == 3.5
    assert s[("loom:last_drain_seconds", m)] == 1.5
    # closed with a request in flight and a lease held: draining, and only that phase is 1
    phases = {p: s[("loom:worker_phase", (*m, ("phase", p)))] for p in PHASES}
    assert phases == {"serving": 0, "draining": 1, "paused": 0}
    assert s[("process_start_time_seconds", ())] > 0
    cache = (("block_size", "16"), ("model_name", "tiny"), ("num_gpu_blocks", "64"))
    assert s[("vllm:cache_config_info", cache)] == 1


def test_finished_requests_feed_the_latency_histograms() -> None:
    metrics = ServerMetrics("tiny", Snapshot(STATS, 0))
    timing = RequestMetrics(
        arrival_time=10.0, scheduled_time=10.5, first_token_time=11.0, last_token_time=12.0,
        finished_time=12.0, inter_token_latencies=(0.5, 0.5),
    )  # fmt: skip
    metrics.observe_finished("length", timing)
    metrics.observe_finished("stop", None)
    s = _samples(metrics)
    m = (("model_name", "tiny"),)
    assert s[("vllm:request_success_total", (("finished_reason", "length"), *m))] == 1
    assert s[("vllm:request_success_total", (("finished_reason", "stop"), *m))] == 1
    assert s[("vllm:time_to_first_token_seconds_sum", m)] == 1.0
    assert s[("vllm:request_queue_time_seconds_sum", m)] == 0.5
    assert s[("vllm:request_prefill_time_seconds_sum", m)] == 0.5
    assert s[("vllm:request_decode_time_seconds_sum", m)] == 1.0
    assert s[("vllm:e2e_request_latency_seconds_sum", m)] == 2.0
    assert s[("vllm:inter_token_latency_seconds_count", m)] == 2


def test_two_servers_in_one_process_keep_separate_registries() -> None:
    a = ServerMetrics("a", Snapshot(STATS, 0))
    b = ServerMetrics("b", Snapshot(STATS, 0))
    a.observe_finished("stop", None)
    assert ("vllm:request_success_total", (("finished_reason", "stop"), ("model_name", "a"))) in (
        _samples(a)
    )
    assert not any(name == "vllm:request_success_total" for name, _ in _samples(b))


def test_a_failing_engine_does_not_break_the_scrape() -> None:
    class Broken:
        def stats(self) -> EngineStats:
            raise RuntimeError("engine gone")

        def in_flight(self) -> int:
            return 0

    metrics = ServerMetrics("tiny", Broken())
    metrics.observe_finished("stop", None)
    names = {name for name, _ in _samples(metrics)}
    assert "vllm:request_success_total" in names
    assert "vllm:num_requests_running" not in names


def test_the_worker_phase_follows_admission_and_what_is_left() -> None:
    cases = [
        ((True, 3, 1), "serving"),
        ((False, 1, 0), "draining"),
        ((False, 0, 2), "draining"),  # a prefill keeps its leases until the decode pulls
        ((False, 0, 0), "paused"),
    ]
    for args, phase in cases:
        assert worker_phase(*args) == phase, args


def test_the_host_kv_tier_is_exported() -> None:
    stats = replace(
        STATS,
        kv_offload_capacity_bytes=1 << 30,
        kv_offload_used_bytes=4 << 20,
        kv_offloaded_blocks=40,
        kv_reload_tokens=320,
        kv_reload_bytes=20 << 20,
    )
    s = _samples(ServerMetrics("tiny", Snapshot(stats, in_flight=0)))
    m = (("model_name", "tiny"),)
    assert s[("loom:kv_offload_capacity_bytes", m)] == 1 << 30
    assert s[("loom:kv_offload_used_bytes", m)] == 4 << 20
    assert s[("loom:kv_offloaded_blocks_total", m)] == 40
    assert s[("loom:kv_reload_tokens_total", m)] == 320
    assert s[("loom:kv_reload_bytes_total", m)] == 20 << 20


def test_hisparse_tiers_are_exported_with_the_hot_buffer_hit_rate() -> None:
    stats = replace(
        STATS,
        hisparse_host_pool_bytes=48 << 30,
        hisparse_hot_hits=30,
        hisparse_hot_misses=90,
        hisparse_h2d_bytes=90 * 656,
        hisparse_prefill_h2d_bytes=4096,
        hisparse_keys_h2d_bytes=640,
        hisparse_hot_requests=2,
    )
    s = _samples(ServerMetrics("tiny", Snapshot(stats, in_flight=0)))
    m = (("model_name", "tiny"),)
    assert s[("loom:hisparse_host_pool_bytes", m)] == 48 << 30
    assert s[("loom:hisparse_hot_hit_rate", m)] == 0.25
    assert s[("loom:hisparse_hot_hits_total", m)] == 30
    assert s[("loom:hisparse_hot_misses_total", m)] == 90
    assert s[("loom:hisparse_h2d_bytes_total", m)] == 90 * 656
    assert s[("loom:hisparse_prefill_h2d_bytes_total", m)] == 4096
    assert s[("loom:hisparse_keys_h2d_bytes_total", m)] == 640
    assert s[("loom:hisparse_hot_requests", m)] == 2
    off = _samples(ServerMetrics("tiny", Snapshot(STATS, in_flight=0)))
    assert off[("loom:hisparse_hot_hit_rate", m)] == 0.0  # nothing looked up: no division


def test_a_parallel_engines_ranks_are_exported_per_rank() -> None:
    ranks = (RankKVStats(0, 1536, 156, 160 * 1536, 1), RankKVStats(1, 1536, 154, 160 * 1536, 1))
    s = _samples(ServerMetrics("tiny", Snapshot(replace(STATS, ranks=ranks), in_flight=1)))
    for r in ranks:
        labels = (("model_name", "tiny"), ("rank", str(r.rank)))
        assert s[("loom:rank_kv_tokens", labels)] == r.kv_tokens
        assert s[("loom:rank_kv_bytes", labels)] == r.kv_bytes
        assert s[("loom:rank_kv_bytes_per_token", labels)] == 1536
        assert s[("loom:rank_sequences", labels)] == 1
    one = _samples(ServerMetrics("tiny", Snapshot(STATS, in_flight=0)))
    assert not any(name.startswith("loom:rank_") for name, _ in one)  # one rank: no series


def test_mtp_speculation_is_exported_under_vllms_spec_decode_names() -> None:
    spec = SpecDecodeStats(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12,
                           accepted_per_pos=(7, 4, 1))  # fmt: skip
    s = _samples(ServerMetrics("tiny", Snapshot(replace(STATS, spec=spec), in_flight=1)))
    m = (("model_name", "tiny"),)
    assert s[("vllm:spec_decode_num_drafts_total", m)] == 10
    assert s[("vllm:spec_decode_num_draft_tokens_total", m)] == 30
    assert s[("vllm:spec_decode_num_accepted_tokens_total", m)] == 12
    for position, accepted in enumerate((7, 4, 1)):
        labels = (*m, ("position", str(position)))
        assert s[("vllm:spec_decode_num_accepted_tokens_per_pos_total", labels)] == accepted
    off = _samples(ServerMetrics("tiny", Snapshot(STATS, in_flight=0)))
    assert not any(name.startswith("vllm:spec_decode") for name, _ in off)
