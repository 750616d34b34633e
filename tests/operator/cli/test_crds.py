"""`loom crds`: writes the generated CRDs byte-identically; `--check` spots stale files."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_operator.api import crd_files
from loom_operator.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_writes_every_crd_and_rewrites_identically(tmp_path: Path) -> None:
    out = tmp_path / "crds"
    assert main(["crds", "--out", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert first == {name: text.encode() for name, text in crd_files().items()}
    assert main(["crds", "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first


def test_output_matches_the_committed_crds(tmp_path: Path) -> None:
    assert main(["crds", "--out", str(tmp_path)]) == 0
    for path in tmp_path.iterdir():
        assert (ROOT / "crds" / path.name).read_bytes() == path.read_bytes()


def test_check_reports_stale_files_without_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["crds", "--out", str(tmp_path)])
    stale = tmp_path / "loom.dev_modelcards.yaml"
    stale.write_text("# edited by hand\n")
    capsys.readouterr()
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 1
    assert capsys.readouterr().out == f"{stale} is out of date: run `loom crds --out {tmp_path}`\n"
    assert stale.read_text() == "# edited by hand\n"
    main(["crds", "--out", str(tmp_path)])
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 0


def test_docs_option_refreshes_the_field_tables(tmp_path: Path) -> None:
    docs = tmp_path / "cards.md"
    docs.write_text((ROOT / "docs" / "cards.md").read_text().replace("| `spec.family` |", "| x |"))
    out = tmp_path / "crds"
    assert main(["crds", "--out", str(out), "--docs", str(docs), "--check"]) == 1
    assert main(["crds", "--out", str(out), "--docs", str(docs)]) == 0
    assert docs.read_bytes() == (ROOT / "docs" / "cards.md").read_bytes()


def test_the_chart_holds_the_generated_crds_and_rbac_rules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """charts/loom/crds and files/operator-rules.yaml are `make crds` output, never hand-edited."""
    args = ["crds", "--out", str(ROOT / "crds"), "--chart", str(ROOT / "charts" / "loom")]
    assert main([*args, "--check"]) == 0, capsys.readouterr().out
