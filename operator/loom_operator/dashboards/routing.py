"""Routing: prefix-cache hit rate, picks per endpoint and why, spills, migrations, pick time.

Owns which series show the router's decisions; the hit rate is vLLM's prefix-cache counters.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from loom_operator.dashboards.panels import Chart, Query, Section, dashboard, quantiles, rate
from loom_runtime.wire import metric_names as names

UID = "loom-routing"


def build() -> Dashboard:
    picks = Section(
        "Picks",
        (
            Chart(
                "Prefix-cache hit rate (per worker)",
                "Prompt tokens found in the worker's prefix cache over those looked up "
                f"({names.PREFIX_CACHE_HITS} / {names.PREFIX_CACHE_QUERIES}).",
                "percentunit",
                (
                    Query(
                        f"{rate(names.total(names.PREFIX_CACHE_HITS), 'instance')} / "
                        f"{rate(names.total(names.PREFIX_CACHE_QUERIES), 'instance')}",
                        "{{instance}}",
                    ),
                ),
            ),
            Chart(
                "Picks per endpoint",
                "Requests the router sent to each endpoint.",
                "reqps",
                (
                    Query(
                        rate(names.total(names.router_metric(names.ROUTER_ROUTED)), "endpoint"),
                        "{{endpoint}}",
                    ),
                ),
            ),
            Chart(
                "Picks by reason",
                "Why the chosen endpoint won: prefix (cached blocks), session, load, spill "
                "(moved off a hot endpoint), migration.",
                "reqps",
                (
                    Query(
                        rate(names.total(names.router_metric(names.ROUTER_ROUTED)), "reason"),
                        "{{reason}}",
                    ),
                ),
            ),
            Chart(
                "Spills",
                "Requests moved off a hot endpoint despite its cached prefix, by the endpoint "
                "that took them.",
                "reqps",
                (
                    Query(
                        rate(
                            names.total(names.router_metric(names.ROUTER_ROUTED)),
                            "endpoint",
                            '{reason="spill"}',
                        ),
                        "{{endpoint}}",
                    ),
                ),
            ),
        ),
    )
    moves = Section(
        "Migrations and the router itself",
        (
            Chart(
                "Migrations by outcome",
                "Requests moved to another worker (a worker failed or was drained past its "
                "timeout): resumed mid-stream, restarted from the start, or failed.",
                "reqps",
                (
                    Query(
                        rate(names.total(names.router_metric(names.ROUTER_MIGRATIONS)), "outcome"),
                        "{{outcome}}",
                    ),
                ),
            ),
            Chart(
                "Router pick time",
                "Arrival to chosen endpoint: reading, tokenizing, hashing, any wait for paused "
                "capacity, and the pick.",
                "s",
                quantiles(names.router_metric(names.ROUTER_PICK_SECONDS), "pick"),
            ),
            Chart(
                "Requests on each endpoint (router's count)",
                "What the router has in flight on each endpoint now.",
                "short",
                (
                    Query(
                        f"sum by (endpoint) ({names.router_metric(names.ROUTER_IN_FLIGHT)})",
                        "{{endpoint}}",
                    ),
                ),
            ),
            Chart(
                "Prefix-index entries",
                "Entries of the router's prefix indexes (precise: from KV events; approximate: "
                "from what it routed).",
                "short",
                (
                    Query(
                        f"sum by (index) ({names.router_metric(names.ROUTER_INDEX_ENTRIES)})",
                        "{{index}}",
                    ),
                ),
            ),
        ),
    )
    return dashboard(
        UID,
        "Loom / Routing",
        "Where the router sends requests and why: prefix-cache hits, spills, migrations.",
        (picks, moves),
    )
