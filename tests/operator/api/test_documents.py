"""Multi-document files: routing by kind, cross-card checks, every error with file:doc:path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loom_operator.api import load_documents, parse_documents
from loom_runtime.card import CardError


def _write(path: Path, *docs: Any) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def _errors(path: Path) -> list[str]:
    with pytest.raises(CardError) as info:
        load_documents(path)
    return [str(e) for e in info.value.errors]


def test_loads_model_and_deployment_cards(
    tmp_path: Path, model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"}}
    cards = load_documents(_write(tmp_path / "c.yaml", model_data, secret, deploy_data))
    assert [c.name for c in cards.model_cards] == ["tiny"]
    assert [c.name for c in cards.deployment_cards] == ["tiny-pd"]
    assert cards.skipped == ("Secret/hf-token",)
    assert cards.model_card("tiny") is cards.model_cards[0]
    assert cards.model_card("tiny", namespace="other") is None


def test_deployment_alone_is_valid_when_the_model_is_applied_apart(
    tmp_path: Path, deploy_data: dict[str, Any]
) -> None:
    cards = load_documents(_write(tmp_path / "d.yaml", deploy_data))
    assert cards.deployment_cards[0].spec.model_card == "tiny"


def test_model_card_reference_must_resolve_within_the_file(
    tmp_path: Path, model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    deploy_data["spec"]["modelCard"] = "tiny-2"
    path = _write(tmp_path / "c.yaml", model_data, deploy_data)
    assert _errors(path) == [
        f"{path}:2: spec.modelCard: no ModelCard named 'tiny-2' in this file (it has: tiny)"
    ]


def test_errors_of_all_documents_are_collected(
    tmp_path: Path, model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    model_data["spec"]["recipe"]["assumesLoop"] = "chat"
    deploy_data["spec"]["roles"]["decode"]["parallelism"] = {"dp": 2, "ep": 3}
    deploy_data["spec"]["weightSync"] = {"maxUnavailable": 0}
    unknown = {"apiVersion": "loom.dev/v1alpha1", "kind": "RouterCard"}
    path = _write(tmp_path / "c.yaml", model_data, deploy_data, unknown, ["not", "a", "map"])
    assert _errors(path) == [
        f"{path}:1: spec.recipe.assumesLoop: no loop named 'chat' (declared: generate)",
        f"{path}:2: spec.roles.decode.parallelism.ep: ep (3) must divide the rank count "
        "dp × tp × pcp (2)",
        f"{path}:2: spec.weightSync.maxUnavailable: Input should be greater than or equal to 1",
        f"{path}:3: kind: unknown kind 'RouterCard' in loom.dev: use ModelCard or DeploymentCard",
        f"{path}:4: a document must be a mapping with apiVersion, kind, metadata and spec",
    ]


def test_duplicate_names_in_one_file_are_errors(tmp_path: Path, model_data: dict[str, Any]) -> None:
    path = _write(tmp_path / "c.yaml", model_data, model_data)
    assert _errors(path) == [
        f"{path}:2: metadata.name: another ModelCard in this file is named 'tiny'"
    ]


def test_same_name_in_other_namespaces_is_fine(model_data: dict[str, Any]) -> None:
    other = {**model_data, "metadata": {"name": "tiny", "namespace": "team-b"}}
    cards = parse_documents([(1, model_data), (2, other)], "x.yaml")
    assert cards.model_card("tiny", "team-b") is cards.model_cards[1]


def test_wrong_api_version_is_an_error(model_data: dict[str, Any]) -> None:
    model_data["apiVersion"] = "loom.dev/v1"
    with pytest.raises(CardError) as info:
        parse_documents([(1, model_data)], "x.yaml")
    assert [(e.source, e.path, e.code) for e in info.value.errors] == [
        ("x.yaml:1", "apiVersion", "literal_error")
    ]


def test_compatibility_with_the_named_model_is_checked(
    tmp_path: Path, model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    deploy_data["spec"]["roles"]["decode"]["hiSparse"] = {"hostPoolGiB": 48, "offloadGiB": 16}
    path = _write(tmp_path / "c.yaml", model_data, deploy_data)
    assert _errors(path) == [
        f"{path}:2: spec.roles.decode.hiSparse: hiSparse needs a sparse-mla model; 'tiny' is llama"
    ]
