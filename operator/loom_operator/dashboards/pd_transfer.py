"""P/D and KV transfer: KV pulled per second, prefill modes, fallbacks, expired leases.

Owns which series show the disaggregated path; never decides what counts as a failure (the
runtime and router count; this only plots).
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from loom_operator.dashboards.panels import RATE, Chart, Query, Section, dashboard, rate
from loom_runtime.wire import metric_names as names

UID = "loom-pd-kv"


def build() -> Dashboard:
    pulls = Section(
        "KV pulls (decode workers)",
        (
            Chart(
                "KV pulled per second",
                "Bytes of KV each decode worker pulled from prefill workers.",
                "Bps",
                (Query(rate(names.total(names.KV_PULLED_BYTES), "instance"), "{{instance}}"),),
            ),
            Chart(
                "Prompt tokens pulled per second",
                "Prompt tokens whose KV came from a prefill worker instead of being computed.",
                "short",
                (Query(rate(names.total(names.KV_PULLED_TOKENS), "instance"), "{{instance}}"),),
            ),
            Chart(
                "Pulls in flight and leases held",
                "Decode requests awaiting their KV, and prefill KV leases awaiting a pull.",
                "short",
                (
                    Query(f"sum by (instance) ({names.KV_PULLS_IN_FLIGHT})", "{{instance}} pulls"),
                    Query(f"sum by (instance) ({names.KV_LEASES})", "{{instance}} leases"),
                ),
            ),
            Chart(
                "KV pull failures",
                "Pulls that failed (the decode then answers with an error or the router "
                "retries), per decode worker.",
                "short",
                (
                    Query(
                        "sum by (instance) "
                        f"(increase({names.total(names.KV_TRANSFER_FAILURES)}[{RATE}]))",
                        "{{instance}}",
                    ),
                ),
            ),
        ),
    )
    router = Section(
        "Prefill path (router)",
        (
            Chart(
                "Requests by prefill mode",
                "remote-prefill: a prefill worker computed the prompt; local-prefill: the decode "
                "worker did (too few uncached tokens, or a fallback).",
                "reqps",
                (
                    Query(
                        rate(names.total(names.router_metric(names.ROUTER_PD)), "mode"), "{{mode}}"
                    ),
                ),
            ),
            Chart(
                "P/D fallbacks by reason",
                "Remote prefills that failed, so the decode worker prefilled locally.",
                "reqps",
                (
                    Query(
                        rate(names.total(names.router_metric(names.ROUTER_PD_FALLBACKS)), "reason"),
                        "{{reason}}",
                    ),
                ),
            ),
            Chart(
                "Expired KV leases",
                "Prefill leases that expired before any decode pulled them (their blocks are "
                "freed), per prefill worker.",
                "short",
                (
                    Query(
                        f"sum by (instance) (increase({names.total(names.KV_EXPIRED)}[{RATE}]))",
                        "{{instance}}",
                    ),
                ),
            ),
            Chart(
                "Free KV blocks (per worker)",
                "KV blocks free or evictable: a prefill short of them is holding leases.",
                "short",
                (Query(f"sum by (instance) ({names.KV_FREE_BLOCKS})", "{{instance}}"),),
            ),
        ),
    )
    return dashboard(
        UID,
        "Loom / P/D and KV transfer",
        "Disaggregated prefill and decode: KV pulled, prefill modes, fallbacks, leases.",
        (pulls, router),
    )
