"""Weight sync and failover: the weights version each worker serves, sync phases, drain time,
restarts and endpoints the router took out.

Owns which series show a sync and a failover; phases are the worker's own view (serving →
draining → paused → serving on the new version).
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from loom_operator.dashboards.panels import RANGE, RATE, Chart, Query, Section, dashboard, rate

UID = "loom-weight-sync"

# Loom's processes among everything the Prometheus scrapes: workers and routers.
LOOM_TARGETS = "on (instance, job) (loom:weights_version_info or loom_router:held_requests)"


def build() -> Dashboard:
    sync = Section(
        "Weight sync",
        (
            Chart(
                "Weights version per worker",
                "One line per worker and version it serves (loom:weights_version_info); during "
                "a Rolling sync two versions show, after a Barrier one.",
                "short",
                (
                    Query(
                        "max by (instance, version) (loom:weights_version_info)",
                        "{{instance}} {{version}}",
                    ),
                ),
            ),
            Chart(
                "Workers per sync phase",
                "serving: admission open; draining: closed, requests or KV leases left; paused: "
                "closed and idle (ready for LoadWeights).",
                "short",
                (Query("sum by (phase) (loom:worker_phase)", "{{phase}}"),),
            ),
            Chart(
                "Drain time",
                "How long the latest drain took on each worker (admission closed until idle), "
                "and the mean over the window of every drain.",
                "s",
                (
                    Query("max by (instance) (loom:last_drain_seconds)", "{{instance}} latest"),
                    Query(
                        f"{rate('loom:drain_seconds_total')} / {rate('loom:drains_total')}", "mean"
                    ),
                ),
            ),
            Chart(
                "Requests held for paused capacity",
                "Requests the router holds (not refuses) while every worker that could take "
                "them is paused: a Barrier sync or a capacity gap.",
                "short",
                (Query("sum (loom_router:held_requests)", "held"),),
            ),
        ),
    )
    failover = Section(
        "Failover",
        (
            Chart(
                "Restarts in the time range",
                "Process restarts of each worker and router (changes of its start time).",
                "short",
                (
                    Query(
                        f"changes(process_start_time_seconds[{RANGE}]) and {LOOM_TARGETS}",
                        "{{instance}}",
                    ),
                ),
            ),
            Chart(
                "Endpoints by routing state",
                "The router's view: routable, draining, down, not ready.",
                "short",
                (Query("max by (state) (loom_router:endpoints)", "{{state}}"),),
            ),
            Chart(
                "Endpoints marked down",
                "Endpoints the router took out of routing, by cause (refused: a connection "
                "refused; probe: failed health probes).",
                "short",
                (
                    Query(
                        "sum by (endpoint, cause) "
                        f"(increase(loom_router:marked_down_total[{RATE}]))",
                        "{{endpoint}} {{cause}}",
                    ),
                ),
            ),
            Chart(
                "Requests in flight (per worker)",
                "Admitted and not finished: what a draining worker still has to finish.",
                "short",
                (Query("sum by (instance) (loom:in_flight_requests)", "{{instance}}"),),
            ),
        ),
    )
    return dashboard(
        UID,
        "Loom / Weight sync and failover",
        "Weights versions, sync phases, drain time, restarts and endpoints marked down.",
        (sync, failover),
    )
