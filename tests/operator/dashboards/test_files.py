"""The dashboard files: what `make dashboards` writes is what the chart ships (drift fails), and
each file is a Grafana dashboard by the SDK's own model types — it reads back through
`Dashboard.from_json` into timeseries panels with Prometheus queries and writes out unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard, prometheus, timeseries

from loom_operator.cli import main
from loom_operator.dashboards.files import dashboard_files, targets
from loom_operator.dashboards.panels import DATASOURCE_VARIABLE

ROOT = Path(__file__).resolve().parents[3]
CHART_DASHBOARDS = ROOT / "charts" / "loom" / "dashboards"
FILES = dashboard_files()


def test_the_chart_ships_exactly_the_generated_dashboards() -> None:
    shipped = {p.name: p.read_text(encoding="utf-8") for p in CHART_DASHBOARDS.glob("*.json")}
    assert sorted(shipped) == sorted(FILES), "run `make dashboards`"
    stale = [name for name, text in FILES.items() if shipped[name] != text]
    assert not stale, f"{stale} differ from the code: run `make dashboards`"


def test_check_mode_reports_a_hand_edit_and_a_stray_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboards", "--out", str(tmp_path)]) == 0
    assert main(["dashboards", "--out", str(tmp_path), "--check"]) == 0
    edited = tmp_path / "loom-fleet.json"
    edited.write_text(edited.read_text().replace("Loom / Fleet", "Mine"))
    (tmp_path / "extra.json").write_text("{}")
    assert main(["dashboards", "--out", str(tmp_path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "loom-fleet.json is out of date" in out and "extra.json is not a generated" in out


@pytest.mark.parametrize("name", sorted(FILES))
def test_each_file_round_trips_through_the_sdk_models(name: str) -> None:
    register_default_plugins()  # so panels and queries decode to their plugin's types
    text = FILES[name]
    model = dashboard.Dashboard.from_json(json.loads(text))
    assert json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n" == text
    assert model.schema_version == 41 and model.uid == name.removesuffix(".json")
    panels = [p for p in model.panels or [] if isinstance(p, dashboard.Panel)]
    rows = [p for p in model.panels or [] if isinstance(p, dashboard.RowPanel)]
    assert rows and len(panels) >= 6
    ids = [p.id_val for p in rows] + [p.id_val for p in panels]
    assert len(set(ids)) == len(ids), f"panel ids repeat: {ids}"
    for p in panels:
        assert p.type_val == "timeseries" and isinstance(p.options, timeseries.Options), p.title
        assert p.targets, f"{p.title} has no query"
        for t in p.targets:
            assert isinstance(t, prometheus.Dataquery), f"{p.title}: {type(t).__name__}"
            assert t.datasource is not None and t.datasource.uid == f"${{{DATASOURCE_VARIABLE}}}"
            assert t.expr and t.legend_format, p.title


def test_uids_are_unique_and_every_query_has_its_own_ref_id() -> None:
    docs = [json.loads(text) for text in FILES.values()]
    assert len({d["uid"] for d in docs}) == len(docs) == 4
    for d in docs:
        found = targets(d)
        assert len(found) >= 8, d["uid"]
        keys = [(t.panel, t.ref_id) for t in found]
        assert len(set(keys)) == len(keys), d["uid"]
