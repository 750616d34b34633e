"""The Prometheus metric names more than one component reads: the worker's (vLLM's names plus
`loom:*`), which the router scrapes, the operator probes and the dashboards chart, and the
router's (`loom_router:*`), which the dashboards chart.

Owns the names as registered (a counter is exposed with `_total`, an info with `_info`: `total`
and `info` spell those); never registers, renders or parses a metric. A name only its own
/metrics shows stays next to its help text.
"""

from __future__ import annotations

# --- the worker: vLLM's names (REFERENCE.md §C), so vLLM dashboards and routers read Loom -------
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"

# --- the worker: Loom's own ------------------------------------------------------------------
ADMISSION_OPEN = "loom:admission_open"
IN_FLIGHT_REQUESTS = "loom:in_flight_requests"
PREFILL_BACKLOG_TOKENS = "loom:prefill_backlog_tokens"
PROMPT_TOKENS_ARRIVED = "loom:prompt_tokens_arrived"
"""A counter: prompt tokens of requests as they arrive (the planner's offered prefill load;
`vllm:prompt_tokens` counts them as they are scheduled, so it stalls when the worker does)."""
KV_FREE_BLOCKS = "loom:kv_free_blocks"
KV_LEASES = "loom:kv_leases"
KV_PULLS_IN_FLIGHT = "loom:kv_pulls_in_flight"
KV_EXPIRED = "loom:kv_expired"
KV_TRANSFER_FAILURES = "loom:kv_transfer_failures"
KV_PULLED_TOKENS = "loom:kv_pulled_tokens"
KV_PULLED_BYTES = "loom:kv_pulled_bytes"
DRAINS = "loom:drains"
DRAIN_SECONDS = "loom:drain_seconds"
LAST_DRAIN_SECONDS = "loom:last_drain_seconds"
WORKER_PHASE = "loom:worker_phase"
WEIGHTS_VERSION = "loom:weights_version"
"""An info metric: exposed as `info(WEIGHTS_VERSION)`, its `version` label the version."""

# --- the router (loom_router.shell.metrics registers them under ROUTER_PREFIX) ---------------
ROUTER_PREFIX = "loom_router:"
ROUTER_REQUESTS = "requests"
ROUTER_ROUTED = "routed"
ROUTER_MIGRATIONS = "migrations"
ROUTER_PD = "pd"
ROUTER_PD_FALLBACKS = "pd_fallbacks"
ROUTER_UPSTREAM_ERRORS = "upstream_errors"
ROUTER_MARKED_DOWN = "marked_down"
ROUTER_TIME_TO_FIRST_TOKEN = "time_to_first_token_seconds"
ROUTER_PICK_SECONDS = "pick_seconds"
ROUTER_IN_FLIGHT = "in_flight"
ROUTER_INDEX_ENTRIES = "index_entries"
ROUTER_HELD_REQUESTS = "held_requests"
ROUTER_ENDPOINTS = "endpoints"


def router_metric(name: str) -> str:
    """The full name of one of the router's metrics."""
    return ROUTER_PREFIX + name


def total(name: str) -> str:
    """A counter's sample name (Prometheus exposes counters with `_total`)."""
    return name + "_total"


def info(name: str) -> str:
    """An info metric's sample name."""
    return name + "_info"
