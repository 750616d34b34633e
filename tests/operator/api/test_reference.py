"""The field reference in docs/cards.md is generated from the models and kept current."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_operator.api.reference import BEGIN, END, field_tables, splice

DOCS = Path(__file__).resolve().parents[3] / "docs" / "cards.md"


def test_docs_field_reference_is_current() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert splice(text, field_tables()) == text, "run `loom crds --out crds --docs docs/cards.md`"


@pytest.mark.parametrize(
    "row",
    [
        "| `spec.recipe.assumesLoop` | string | required | DNS-1123 label |",
        '| `spec.components[].weightsVersion` | string | `"v1"` | label value |',
        "| `spec.roles.<role>.parallelism.dcp` | integer | `1` | ≥ 1 |",
        "| `spec.roles.<role>.hiSparse.hostPoolGiB` | number | required | > 0 |",
        "| `spec.weightSync.maxUnavailable` | integer | `1` | ≥ 1 |",
        "| `spec.roles.<role>.resources.memory` | quantity | — |  |",
        "| `status.readyRoles` | string | — |  |",
        "| `status.roles.<key>.weightsVersion` | string | — |  |",
    ],
)
def test_tables_show_type_default_and_limits(row: str) -> None:
    assert row in field_tables()


def test_same_shaped_roles_share_their_rows() -> None:
    tables = field_tables()
    assert "`spec.roles.prefill`" in tables and "`spec.roles.aggregated`" in tables
    assert "spec.roles.prefill.engine" not in tables


def test_splice_replaces_only_the_generated_part() -> None:
    text = f"intro\n{BEGIN}\nold\n{END}\noutro\n"
    assert splice(text, "new\n") == f"intro\n{BEGIN}\n\nnew\n\n{END}\noutro\n"
    with pytest.raises(ValueError, match="markers"):
        splice("no markers here", "x")
