"""Reading cards from files: multi-document YAML, the ModelCard loader and its errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loom_runtime.card import CardError, load_model_card, read_documents


def _write(path: Path, *docs: Any) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def _deployment() -> dict[str, Any]:
    return {"apiVersion": "loom.dev/v1alpha1", "kind": "DeploymentCard", "spec": {"bad": 1}}


def test_loads_the_model_card_and_skips_other_kinds(
    tmp_path: Path, card_data: dict[str, Any]
) -> None:
    path = _write(tmp_path / "cards.yaml", _deployment(), card_data, None)
    card = load_model_card(path)
    assert card.name == "tiny"
    assert card.component("decoder").source.uri == "loom://tiny"


def test_errors_name_the_file_and_document(tmp_path: Path, card_data: dict[str, Any]) -> None:
    card_data["spec"]["recipe"]["assumesLoop"] = "nope"
    path = _write(tmp_path / "cards.yaml", _deployment(), card_data)
    with pytest.raises(CardError) as info:
        load_model_card(path)
    assert [str(e) for e in info.value.errors] == [
        f"{path}:2: spec.recipe.assumesLoop: no loop named 'nope' (declared: generate)"
    ]


def test_picks_a_model_card_by_name(tmp_path: Path, card_data: dict[str, Any]) -> None:
    other = {**card_data, "metadata": {"name": "other"}}
    path = _write(tmp_path / "cards.yaml", card_data, other)
    assert load_model_card(path, name="other").name == "other"
    with pytest.raises(CardError, match="2 ModelCards"):
        load_model_card(path)
    with pytest.raises(CardError, match="no ModelCard named 'x'"):
        load_model_card(path, name="x")


def test_file_without_model_card_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CardError, match="no ModelCard in the file"):
        load_model_card(_write(tmp_path / "d.yaml", _deployment()))


def test_relative_weights_resolve_next_to_the_card(
    tmp_path: Path, card_data: dict[str, Any]
) -> None:
    card_data["spec"]["components"][0]["source"]["uri"] = "file:weights/tiny"
    path = _write(tmp_path / "cards.yaml", card_data)
    card = load_model_card(path)
    assert card.component("decoder").source.local_path(path) == tmp_path / "weights" / "tiny"


def test_invalid_yaml_and_missing_files_are_card_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ModelCard\nspec: [unclosed\n")
    with pytest.raises(CardError) as info:
        read_documents(bad)
    assert info.value.errors[0].code == "yaml" and info.value.errors[0].source == str(bad)
    with pytest.raises(CardError) as missing:
        read_documents(tmp_path / "missing.yaml")
    assert missing.value.errors[0].code == "io"


def test_read_documents_numbers_documents_from_one_and_drops_empty(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("a: 1\n---\n---\nb: 2\n")
    assert read_documents(path) == [(1, {"a": 1}), (3, {"b": 2})]
