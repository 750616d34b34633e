"""`loom validate`: OK lines for good files, every error as `file:doc: path: message`, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_operator.cli import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))

BROKEN = """\
apiVersion: loom.dev/v1alpha1
kind: ModelCard
metadata:
  name: Broken_Model
spec:
  family: llama
  components:
    - name: decoder
      kind: transformer
      source: {uri: "ftp://models/tiny"}
  loops:
    - {name: generate, kind: ar_decode, components: [decoder, draft], steps: 4}
  recipe: {method: base, assumesLoop: generat, assumesPrecision: bf16}
---
apiVersion: loom.dev/v1alpha1
kind: DeploymentCard
metadata:
  name: broken
spec:
  modelCard: tiny
  roles:
    prefill:
      parallelism: {dp: 2, pcp: 4, dcp: 3}
      hiSparse: {hostPoolGiB: 48, offloadGiB: 16}
    aggregated: {}
  weightSync: {maxUnavailable: 0, stratgy: Barrier}
"""

# Every problem above, with its document and field path, in the order the file lists them.
EXPECTED = [
    ("1", "metadata.name"),
    ("1", "spec.components[0].source.uri"),
    ("1", "spec.loops[0].components[1]"),
    ("1", "spec.loops[0].steps"),
    ("1", "spec.recipe.assumesLoop"),
    ("2", "spec.roles.prefill.parallelism.pcp"),
    ("2", "spec.roles.prefill.parallelism.dcp"),
    ("2", "spec.roles.decode"),
    ("2", "spec.roles.aggregated"),
    ("2", "spec.roles.prefill.hiSparse"),
    ("2", "spec.weightSync.maxUnavailable"),
    ("2", "spec.weightSync.stratgy"),
]


def test_examples_validate(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(EXAMPLES) >= 3
    assert main(["validate", *EXAMPLES]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(EXAMPLES)
    assert (
        f"OK {ROOT / 'examples' / 'tiny-pd.yaml'} (ModelCard tiny, DeploymentCard tiny-pd)" in out
    )


def test_broken_card_prints_every_error_with_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    assert main(["validate", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    found = []
    for line in lines:
        source, field, message = line.split(": ", 2)
        file, doc = source.rsplit(":", 1)
        assert file == str(path) and message
        found.append((doc, field))
    assert found == EXPECTED


def test_messages_say_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    main(["validate", str(path)])
    out = capsys.readouterr().out
    assert f"{path}:1: spec.recipe.assumesLoop: no loop named 'generat' (declared: generate)" in out
    assert f"{path}:2: spec.roles.prefill.parallelism.dcp: dcp (3) must divide tp × pcp" in out


def test_one_bad_file_fails_the_run_but_all_files_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ModelCard\nspec: [unclosed\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert main(["validate", str(bad), EXAMPLES[0], str(empty)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{bad}: not valid YAML")
    assert out[1].startswith(f"OK {EXAMPLES[0]}")
    assert out[2] == f"{empty}: no ModelCard or DeploymentCard in the file"
    assert out[3] == "2 of 3 files have errors"
