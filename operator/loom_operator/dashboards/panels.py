"""The building blocks the dashboards share: a query, a timeseries panel over the dashboard's
Prometheus data source, quantile queries over a histogram, and the grid layout.

Owns how Loom panels look (units, legends, sizes); never names a metric itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VARIABLE + "}")
RATE = "$__rate_interval"
"""The rate window Grafana picks for the scrape interval; tests substitute a fixed one."""
RANGE = "$__range"
"""The dashboard's time range, for 'how many in the range shown' (restarts)."""
QUANTILES = (0.5, 0.9, 0.99)
WIDTH, HEIGHT = 12, 8  # two panels a row on Grafana's 24-column grid


@dataclass(frozen=True)
class Query:
    """One PromQL expression and the legend of each series it returns."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Chart:
    """One timeseries panel: what it shows, its unit (a Grafana unit id) and its queries."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]


@dataclass(frozen=True)
class Section:
    """A row of the dashboard and the charts under it."""

    title: str
    charts: tuple[Chart, ...]


def rate(metric: str, by: str = "", selector: str = "") -> str:
    """`sum by (by) (rate(metric{selector}[window]))`."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{selector}[{RATE}]))"


def quantiles(histogram: str, what: str) -> tuple[Query, ...]:
    """p50, p90 and p99 of a Prometheus histogram (its `_bucket` series), fleet-wide."""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket[{RATE}])))",
            f"{what} p{round(q * 100)}",
        )
        for q in QUANTILES
    )


def _panel(chart: Chart, panel_id: int) -> timeseries.Panel:
    legend = (
        common_builders.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
    )
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(chart.title)
        .description(chart.description)
        .datasource(DATASOURCE)
        .unit(chart.unit)
        .span(WIDTH)
        .height(HEIGHT)
        .legend(legend)
        .line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
    )
    for n, q in enumerate(chart.queries):
        panel = panel.with_target(
            prometheus.Dataquery()
            .datasource(DATASOURCE)
            .expr(q.expr)
            .legend_format(q.legend)
            .range()
            .ref_id(chr(ord("A") + n))
        )
    return panel


def dashboard(
    uid: str, title: str, description: str, sections: Sequence[Section]
) -> models.Dashboard:
    """A dashboard with a Prometheus data-source picker, one row per section, panel ids in
    order (Grafana keys panel state by id, so they must be unique and stable)."""
    builder = (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["loom"])
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard_builders.DatasourceVariable(DATASOURCE_VARIABLE)
            .label("Data source")
            .type("prometheus")
        )
    )
    panel_id = 0
    for section in sections:
        panel_id += 1
        builder = builder.with_row(dashboard_builders.Row(section.title).id(panel_id))
        for chart in section.charts:
            panel_id += 1
            builder = builder.with_panel(_panel(chart, panel_id))
    return builder.build()
