"""ModelCard parsing: shape, defaults, strictness, and every error collected with its path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loom_runtime.card import CardError, ModelCard
from loom_runtime.card.load import parse_card


def _errors(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(CardError) as info:
        parse_card(ModelCard, data)
    return {e.path: e.code for e in info.value.errors}


def test_valid_card_parses_with_defaults(card_data: dict[str, Any]) -> None:
    card = parse_card(ModelCard, card_data)
    comp = card.component("decoder")
    assert card.name == "tiny"
    assert comp.weights_version == "v1"
    assert comp.required_for == ["generate"]
    assert card.loop("generate").cache_policy == "prefix"
    assert card.spec.parity.level == "C1"
    assert card.weights_versions() == {"decoder": "v1"}
    assert card.spec.recipe.assumes_loop == "generate"


def test_python_names_populate_the_same_fields(card_data: dict[str, Any]) -> None:
    card = parse_card(ModelCard, card_data)
    dumped = card.model_dump(by_alias=True, exclude_none=True)
    assert dumped["spec"]["recipe"]["assumesLoop"] == "generate"
    again = ModelCard.model_validate(card.model_dump())  # snake_case keys
    assert again == card


def test_round_trip_through_yaml_names_is_lossless(card_data: dict[str, Any]) -> None:
    card = parse_card(ModelCard, card_data)
    assert parse_card(ModelCard, card.model_dump(by_alias=True, mode="json")) == card


def test_unknown_fields_are_errors(card_data: dict[str, Any]) -> None:
    card_data["spec"]["components"][0]["weightVersion"] = "v2"  # typo of weightsVersion
    assert _errors(card_data) == {"spec.components[0].weightVersion": "extra_forbidden"}


def test_types_are_strict_like_the_api_server(card_data: dict[str, Any]) -> None:
    card_data["spec"]["components"][0]["weightsVersion"] = 2
    card_data["spec"]["loops"][0]["steps"] = "4"
    errors = _errors(card_data)
    assert errors["spec.components[0].weightsVersion"] == "string_type"
    assert errors["spec.loops[0].steps"] == "int_type"


def test_cards_are_immutable(card_data: dict[str, Any]) -> None:
    card = parse_card(ModelCard, card_data)
    with pytest.raises(Exception, match="frozen"):
        card.spec.family = "dit"


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("metadata", "name"), "Tiny"),
        (("metadata", "name"), "a" * 64),
        (("metadata", "name"), "-tiny"),
    ],
)
def test_names_must_be_dns_labels(
    card_data: dict[str, Any], where: tuple[str, str], value: str
) -> None:
    card_data[where[0]][where[1]] = value
    assert _errors(card_data) == {"metadata.name": "dns_label"}


def test_component_and_loop_names_must_be_dns_labels(card_data: dict[str, Any]) -> None:
    card_data["spec"]["components"][0]["name"] = "Decoder"
    card_data["spec"]["loops"][0]["name"] = "gen_1"
    errors = _errors(card_data)
    assert errors["spec.components[0].name"] == "dns_label"
    assert errors["spec.loops[0].name"] == "dns_label"


def test_weights_version_must_be_a_label_value(card_data: dict[str, Any]) -> None:
    card_data["spec"]["components"][0]["weightsVersion"] = "v2 final"
    assert _errors(card_data) == {"spec.components[0].weightsVersion": "label_value"}


def test_server_metadata_is_ignored_so_cluster_objects_parse(card_data: dict[str, Any]) -> None:
    card_data["metadata"].update(
        uid="1234", resourceVersion="99", generation=3, creationTimestamp="2026-01-01T00:00:00Z"
    )
    card_data["status"] = {
        "observedGeneration": 3,
        "conditions": [
            {"type": "Valid", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ],
    }
    card = parse_card(ModelCard, card_data)
    assert card.metadata.generation == 3
    assert card.status is not None and card.status.conditions[0].type == "Valid"


def test_a_broken_card_reports_every_error_at_once(card_data: dict[str, Any]) -> None:
    broken = copy.deepcopy(card_data)
    spec = broken["spec"]
    broken["metadata"]["name"] = "Bad_Name"
    spec["components"][0]["source"]["uri"] = "ftp://x/y"  # structural error in components
    spec["components"][0]["precision"]["kv"] = "int4"
    spec["loops"].append({"name": "denoise", "kind": "diffusion", "components": ["vae"]})
    spec["recipe"]["assumesLoop"] = "generat"
    spec["parity"] = {"level": "C9"}
    assert _errors(broken) == {
        "metadata.name": "dns_label",
        "spec.components[0].source.uri": "uri_scheme",
        "spec.components[0].precision.kv": "literal_error",
        "spec.loops[1].components[0]": "unknown_component",
        "spec.loops[1].kind": "wrong_loop_kind",
        "spec.recipe.assumesLoop": "unknown_loop",
        "spec.parity.level": "literal_error",
    }


def test_a_component_two_loops_list_is_shared_by_them(card_data: dict[str, Any]) -> None:
    assert ModelCard.model_validate(card_data).shared_components() == {}
    card_data["spec"]["loops"].append(
        {"name": "embed", "kind": "encode", "components": ["decoder"]}
    )
    card = ModelCard.model_validate(card_data)
    assert card.shared_components() == {"decoder": ("generate", "embed")}
