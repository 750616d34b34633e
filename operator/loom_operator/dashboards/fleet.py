"""The fleet overview: requests, tokens per second, TTFT / ITL / latency quantiles and errors.

Owns which series the overview shows; the worker series are vLLM's own names (a vLLM dashboard
reads Loom workers unchanged), the client-facing ones are the router's.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from loom_operator.dashboards.panels import Chart, Query, Section, dashboard, quantiles, rate

UID = "loom-fleet"


def build() -> Dashboard:
    traffic = Section(
        "Traffic",
        (
            Chart(
                "Requests by route and status",
                "What clients got from the router: every answer, by OpenAI route and HTTP code.",
                "reqps",
                (Query(rate("loom_router:requests_total", "route, code"), "{{route}} {{code}}"),),
            ),
            Chart(
                "Finished requests by reason (workers)",
                "Requests the workers finished (vllm:request_success), by finish reason.",
                "reqps",
                (
                    Query(
                        rate("vllm:request_success_total", "finished_reason"), "{{finished_reason}}"
                    ),
                ),
            ),
            Chart(
                "Tokens per second",
                "Prompt tokens prefilled and tokens generated, all workers.",
                "short",
                (
                    Query(rate("vllm:prompt_tokens_total"), "prompt"),
                    Query(rate("vllm:generation_tokens_total"), "generated"),
                ),
            ),
            Chart(
                "Requests running and waiting (per worker)",
                "The engine's running batch and its queue.",
                "short",
                (
                    Query("sum by (instance) (vllm:num_requests_running)", "{{instance}} running"),
                    Query("sum by (instance) (vllm:num_requests_waiting)", "{{instance}} waiting"),
                ),
            ),
        ),
    )
    latency = Section(
        "Latency",
        (
            Chart(
                "Time to first token (workers)",
                "vllm:time_to_first_token_seconds: arrival at the worker to its first token.",
                "s",
                quantiles("vllm:time_to_first_token_seconds", "TTFT"),
            ),
            Chart(
                "Time to first token (clients, via the router)",
                "What clients wait for the first streamed chunk, including P/D and routing.",
                "s",
                quantiles("loom_router:time_to_first_token_seconds", "TTFT"),
            ),
            Chart(
                "Inter-token latency",
                "vllm:inter_token_latency_seconds: the gap between streamed tokens.",
                "s",
                quantiles("vllm:inter_token_latency_seconds", "ITL"),
            ),
            Chart(
                "End-to-end request latency (workers)",
                "vllm:e2e_request_latency_seconds: arrival to the last token.",
                "s",
                quantiles("vllm:e2e_request_latency_seconds", "latency"),
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
                        rate("loom_router:requests_total", "route, code", '{code!~"2.."}'),
                        "{{route}} {{code}}",
                    ),
                    Query(rate("loom_router:upstream_errors_total", "kind"), "upstream {{kind}}"),
                ),
            ),
            Chart(
                "KV cache usage (per worker)",
                "vllm:kv_cache_usage_perc: the fraction of KV blocks in use.",
                "percentunit",
                (Query("max by (instance) (vllm:kv_cache_usage_perc)", "{{instance}}"),),
            ),
        ),
    )
    return dashboard(
        UID,
        "Loom / Fleet overview",
        "Requests, tokens per second, latency quantiles and errors of a Loom fleet.",
        (traffic, latency, errors),
    )
