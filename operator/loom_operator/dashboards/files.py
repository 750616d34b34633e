"""The dashboards as files: one JSON document per dashboard, named by its uid, serialised with
the SDK's encoder; and every PromQL expression in them.

Owns file names and the JSON's exact bytes (sorted keys, two-space indent, final newline) so the
chart's copies can be checked for drift; never writes files (the CLI does).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from loom_operator.dashboards import fleet, pd_transfer, routing, weight_sync

BUILDERS: dict[str, Callable[[], Dashboard]] = {
    fleet.UID: fleet.build,
    pd_transfer.UID: pd_transfer.build,
    routing.UID: routing.build,
    weight_sync.UID: weight_sync.build,
}


def to_json(model: Dashboard) -> str:
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def dashboard_files() -> dict[str, str]:
    """File name (`<uid>.json`) -> its text."""
    return {f"{uid}.json": to_json(build()) for uid, build in BUILDERS.items()}


@dataclass(frozen=True)
class Target:
    """One query of one panel, as a dashboard file holds it."""

    dashboard: str
    panel: str
    ref_id: str
    expr: str


def targets(document: Mapping[str, Any]) -> list[Target]:
    """Every Prometheus query of every panel (rows included) of a dashboard JSON document."""
    out = []
    stack = list(document.get("panels", []))
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        for t in panel.get("targets", []):
            out.append(Target(document["uid"], panel["title"], t["refId"], t["expr"]))
    return out
