"""The chart's dashboards template with the real helm: one ConfigMap per generated file, holding
it byte for byte, labelled for the Grafana sidecar, in the release namespace; none when off."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.tools import ensure_tools

from loom_operator.dashboards.files import dashboard_files

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "loom"
TEMPLATE = "templates/dashboards.yaml"


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_tools() / "helm"


def render(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), "template", "obs", str(CHART), "-n", "monitoring", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def config_maps(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_one_labelled_config_map_per_dashboard_file(helm: Path) -> None:
    maps = config_maps(render(helm, "-s", TEMPLATE, "--set", "dashboards.labels.team=ml"))
    files = dashboard_files()
    by_name = {m["metadata"]["name"]: m for m in maps}
    assert sorted(by_name) == sorted(f"obs-dashboard-{n.removesuffix('.json')}" for n in files)
    for name, text in files.items():
        m = by_name[f"obs-dashboard-{name.removesuffix('.json')}"]
        assert m["kind"] == "ConfigMap" and m["metadata"]["namespace"] == "monitoring"
        labels = m["metadata"]["labels"]
        assert labels["grafana_dashboard"] == "1" and labels["team"] == "ml"
        assert labels["app.kubernetes.io/instance"] == "obs"
        assert m["data"] == {name: text.rstrip("\n")}  # a YAML `|-` block keeps all but the end


def test_no_dashboards_when_disabled(helm: Path) -> None:
    names = [
        m["metadata"]["name"]
        for m in config_maps(render(helm, "--set", "dashboards.enabled=false"))
    ]
    assert not [n for n in names if "-dashboard-" in n]
