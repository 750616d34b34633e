"""P/D and KV transfer: KV pulled per second, prefill modes, fallbacks, expired leases.

Owns which series show the disaggregated path; never decides what counts as a failure (the
runtime and router count; this only plots).
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from loom_operator.dashboards.panels import RATE, Chart, Query, Section, dashboard, rate

UID = "loom-pd-kv"


def build() -> Dashboard:
    pulls = Section(
        "KV pulls (decode workers)",
        (
            Chart(
                "KV pulled per second",
                "Bytes of KV each decode worker pulled from prefill workers.",
                "Bps",
                (Query(rate("loom:kv_pulled_bytes_total", "instance"), "{{instance}}"),),
            ),
            Chart(
                "Prompt tokens pulled per second",
                "Prompt tokens whose KV came from a prefill worker instead of being computed.",
                "short",
                (Query(rate("loom:kv_pulled_tokens_total", "instance"), "{{instance}}"),),
            ),
            Chart(
                "Pulls in flight and leases held",
                "Decode requests awaiting their KV, and prefill KV leases awaiting a pull.",
                "short",
                (
                    Query("sum by (instance) (loom:kv_pulls_in_flight)", "{{instance}} pulls"),
                    Query("sum by (instance) (loom:kv_leases)", "{{instance}} leases"),
                ),
            ),
            Chart(
                "KV pull failures",
                "Pulls that failed (the decode then answers with an error or the router "
                "retries), per decode worker.",
                "short",
                (
                    Query(
                        f"sum by (instance) (increase(loom:kv_transfer_failures_total[{RATE}]))",
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
                (Query(rate("loom_router:pd_total", "mode"), "{{mode}}"),),
            ),
            Chart(
                "P/D fallbacks by reason",
                "Remote prefills that failed, so the decode worker prefilled locally.",
                "reqps",
                (Query(rate("loom_router:pd_fallbacks_total", "reason"), "{{reason}}"),),
            ),
            Chart(
                "Expired KV leases",
                "Prefill leases that expired before any decode pulled them (their blocks are "
                "freed), per prefill worker.",
                "short",
                (
                    Query(
                        f"sum by (instance) (increase(loom:kv_expired_total[{RATE}]))",
                        "{{instance}}",
                    ),
                ),
            ),
            Chart(
                "Free KV blocks (per worker)",
                "KV blocks free or evictable: a prefill short of them is holding leases.",
                "short",
                (Query("sum by (instance) (loom:kv_free_blocks)", "{{instance}}"),),
            ),
        ),
    )
    return dashboard(
        UID,
        "Loom / P/D and KV transfer",
        "Disaggregated prefill and decode: KV pulled, prefill modes, fallbacks, leases.",
        (pulls, router),
    )
