"""Weight sync and failover: the weights version each worker serves, sync phases, drain time,
restarts and endpoints the router took out.

Owns which series show a sync and a failover; phases are the worker's own view (serving →
draining → paused → serving on the new version).
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from loom_operator.dashboards.panels import RANGE, RATE, Chart, Query, Section, dashboard, rate
from loom_runtime.wire import metric_names as names

UID = "loom-weight-sync"

# Loom's processes among everything the Prometheus scrapes: workers and routers.
VERSION_INFO = names.info(names.WEIGHTS_VERSION)
HELD = names.router_metric(names.ROUTER_HELD_REQUESTS)
LOOM_TARGETS = f"on (instance, job) ({VERSION_INFO} or {HELD})"


def build() -> Dashboard:
    sync = Section(
        "Weight sync",
        (
            Chart(
                "Weights version per worker",
                f"One line per worker and version it serves ({VERSION_INFO}); during "
                "a Rolling sync two versions show, after a Barrier one.",
                "short",
                (
                    Query(
                        f"max by (instance, version) ({VERSION_INFO})",
                        "{{instance}} {{version}}",
                    ),
                ),
            ),
            Chart(
                "Workers per sync phase",
                "serving: admission open; draining: closed, requests or KV leases left; paused: "
                "closed and idle (ready for LoadWeights).",
                "short",
                (Query(f"sum by (phase) ({names.WORKER_PHASE})", "{{phase}}"),),
            ),
            Chart(
                "Drain time",
                "How long the latest drain took on each worker (admission closed until idle), "
                "and the mean over the window of every drain.",
                "s",
                (
                    Query(f"max by (instance) ({names.LAST_DRAIN_SECONDS})", "{{instance}} latest"),
                    Query(
                        f"{rate(names.total(names.DRAIN_SECONDS))} / "
                        f"{rate(names.total(names.DRAINS))}",
                        "mean",
                    ),
                ),
            ),
            Chart(
                "Requests held for paused capacity",
                "Requests the router holds (not refuses) while every worker that could take "
                "them is paused: a Barrier sync or a capacity gap.",
                "short",
                (Query(f"sum ({HELD})", "held"),),
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
                (
                    Query(
                        f"max by (state) ({names.router_metric(names.ROUTER_ENDPOINTS)})",
                        "{{state}}",
                    ),
                ),
            ),
            Chart(
                "Endpoints marked down",
                "Endpoints the router took out of routing, by cause (refused: a connection "
                "refused; probe: failed health probes).",
                "short",
                (
                    Query(
                        "sum by (endpoint, cause) "
                        f"(increase({names.total(names.router_metric(names.ROUTER_MARKED_DOWN))}[{RATE}]))",
                        "{{endpoint}} {{cause}}",
                    ),
                ),
            ),
            Chart(
                "Requests in flight (per worker)",
                "Admitted and not finished: what a draining worker still has to finish.",
                "short",
                (Query(f"sum by (instance) ({names.IN_FLIGHT_REQUESTS})", "{{instance}}"),),
            ),
        ),
    )
    return dashboard(
        UID,
        "Loom / Weight sync and failover",
        "Weights versions, sync phases, drain time, restarts and endpoints marked down.",
        (sync, failover),
    )
