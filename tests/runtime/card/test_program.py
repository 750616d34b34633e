"""A ModelCard's programs: think_then_draw thinks with an ar_decode loop and draws with a
diffusion loop that has steps, both on one shared component; each wrong case is one error with
its exact path and code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from loom_runtime.card import CardError, ModelCard
from loom_runtime.card.load import parse_card

Edit = Callable[[dict[str, Any]], None]


def mot_spec(spec: dict[str, Any]) -> None:
    """The card as a mot model with a think-then-draw program."""
    spec["family"] = "mot"
    spec["components"][0]["name"] = "mot"
    spec["components"][0]["requiredFor"] = ["generate", "draw"]
    spec["loops"] = [
        {"name": "generate", "kind": "ar_decode", "components": ["mot"]},
        {"name": "draw", "kind": "diffusion", "components": ["mot"], "steps": 8},
    ]
    spec["programs"] = [
        {
            "name": "think-then-draw",
            "kind": "think_then_draw",
            "think": "generate",
            "draw": "draw",
            "maxThinkTokens": 32,
        }
    ]


def test_a_mot_card_declares_think_then_draw(card_data: dict[str, Any]) -> None:
    mot_spec(card_data["spec"])
    card = parse_card(ModelCard, card_data)
    program = card.program("think-then-draw")
    assert (program.kind, program.think, program.draw) == ("think_then_draw", "generate", "draw")
    assert program.max_think_tokens == 32
    with pytest.raises(KeyError):
        card.program("other")


def test_a_card_without_programs_has_none(card_data: dict[str, Any]) -> None:
    assert parse_card(ModelCard, card_data).spec.programs == []


def _separate_components(spec: dict[str, Any]) -> None:
    spec["components"].append({**spec["components"][0], "name": "image"})
    spec["components"][0]["requiredFor"] = ["generate"]
    spec["components"][1]["requiredFor"] = ["draw"]
    spec["loops"][1]["components"] = ["image"]


def _program(**fields: Any) -> Edit:
    return lambda s: s["programs"][0].update(fields)


CASES: list[tuple[str, Edit, str, str]] = [
    ("think names no loop", _program(think="chat"), "spec.programs[0].think", "unknown_loop"),
    ("draw is no diffusion loop", _program(draw="generate"), "spec.programs[0].draw",
     "wrong_loop_kind"),
    ("think is no ar_decode loop", _program(think="draw"), "spec.programs[0].think",
     "wrong_loop_kind"),
    ("the draw loop has no steps", lambda s: s["loops"][1].pop("steps"),
     "spec.programs[0].draw", "missing_steps"),
    ("the loops share no component", _separate_components, "spec.programs[0]",
     "no_shared_component"),
    ("two programs of one name", lambda s: s["programs"].append(dict(s["programs"][0])),
     "spec.programs[1].name", "duplicate"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "path", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_program_rule_reports_its_path_and_code(
    card_data: dict[str, Any], edit: Edit, path: str, code: str
) -> None:
    mot_spec(card_data["spec"])
    edit(card_data["spec"])
    with pytest.raises(CardError) as info:
        parse_card(ModelCard, card_data)
    assert [(e.path, e.code) for e in info.value.errors] == [(path, code)]


@pytest.mark.parametrize("tokens", [0, 8193])
def test_max_think_tokens_is_bounded(card_data: dict[str, Any], tokens: int) -> None:
    mot_spec(card_data["spec"])
    card_data["spec"]["programs"][0]["maxThinkTokens"] = tokens
    with pytest.raises(CardError, match="maxThinkTokens"):
        parse_card(ModelCard, card_data)
