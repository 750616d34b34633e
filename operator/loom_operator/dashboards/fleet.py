"""The fleet overview: requests, tokens per second, TTFT / ITL / latency quantiles and errors.

Owns which series the overview shows; the worker series are vLLM's own names (a vLLM dashboard
reads Loom workers unchanged), the client-facing ones are the router's.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from loom_operator.dashboards.panels import Chart, Query, Section, dashboard, quantiles, rate
from loom_runtime.wire import metric_names as names

UID = "loom-fleet"


def build() -> Dashboard:
    traffic = Section(
        "Traffic",
        (
            Chart(
                "Requests by route and status",
                "What clients got from the router: every answer, by OpenAI route and HTTP code.",
                "reqps",
                (
                    Query(
                        rate(
                            names.total(names.router_metric(names.ROUTER_REQUESTS)), "route, code"
                        ),
                        "{{route}} {{code}}",
                    ),
                ),
            ),
            Chart(
                "Finished requests by reason (workers)",
                f"Requests the workers finished ({names.REQUEST_SUCCESS}), by finish reason.",
                "reqps",
                (
                    Query(
                        rate(names.total(names.REQUEST_SUCCESS), "finished_reason"),
                        "{{finished_reason}}",
                    ),
                ),
            ),
            Chart(
                "Tokens per second",
                "Prompt tokens prefilled and tokens generated, all workers.",
                "short",
                (
                    Query(rate(names.total(names.PROMPT_TOKENS)), "prompt"),
                    Query(rate(names.total(names.GENERATION_TOKENS)), "generated"),
                ),
            ),
            Chart(
                "Requests running and waiting (per worker)",
                "The engine's running batch and its queue.",
                "short",
                (
                    Query(
                        f"sum by (instance) ({names.NUM_REQUESTS_RUNNING})", "{{instance}} running"
                    ),
                    Query(
                        f"sum by (instance) ({names.NUM_REQUESTS_WAITING})", "{{instance}} waiting"
                    ),
                ),
            ),
        ),
    )
    latency = Section(
        "Latency",
        (
            Chart(
                "Time to first token (workers)",
                f"{names.TIME_TO_FIRST_TOKEN}: arrival at the worker to its first token.",
                "s",
                quantiles(names.TIME_TO_FIRST_TOKEN, "TTFT"),
            ),
            Chart(
                "Time to first token (clients, via the router)",
                "What clients wait for the first streamed chunk, including P/D and routing.",
                "s",
                quantiles(names.router_metric(names.ROUTER_TIME_TO_FIRST_TOKEN), "TTFT"),
            ),
            Chart(
                "Inter-token latency",
                f"{names.INTER_TOKEN_LATENCY}: the gap between streamed tokens.",
                "s",
                quantiles(names.INTER_TOKEN_LATENCY, "ITL"),
            ),
            Chart(
                "End-to-end request latency (workers)",
                f"{names.E2E_REQUEST_LATENCY}: arrival to the last token.",
                "s",
                quantiles(names.E2E_REQUEST_LATENCY, "latency"),
            ),
        ),
    )
    errors = Section(
        "Errors and capacity",
        (
            Chart(
                "Errors",
                "Answers that were not 2xx, by route and code; and failed calls from the router "
                "to workers, by kind (refused: marked down at once; broken: cut mid-answer).",
                "reqps",
                (
                    Query(
                        rate(
                            names.total(names.router_metric(names.ROUTER_REQUESTS)),
                            "route, code",
                            '{code!~"2.."}',
                        ),
                        "{{route}} {{code}}",
                    ),
                    Query(
                        rate(
                            names.total(names.router_metric(names.ROUTER_UPSTREAM_ERRORS)), "kind"
                        ),
                        "upstream {{kind}}",
                    ),
                ),
            ),
            Chart(
                "KV cache usage (per worker)",
                f"{names.KV_CACHE_USAGE}: the fraction of KV blocks in use.",
                "percentunit",
                (Query(f"max by (instance) ({names.KV_CACHE_USAGE})", "{{instance}}"),),
            ),
        ),
    )
    return dashboard(
        UID,
        "Loom / Fleet overview",
        "Requests, tokens per second, latency quantiles and errors of a Loom fleet.",
        (traffic, latency, errors),
    )
