"""The cross-reference rules of a ModelCard spec, one case per rule, with the exact path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from loom_runtime.card import CardError, ModelCard
from loom_runtime.card.load import parse_card

Edit = Callable[[dict[str, Any]], None]


def _diffusion(spec: dict[str, Any]) -> None:
    spec["family"] = "dit"
    spec["components"] = [
        {"name": "dit", "kind": "transformer", "source": {"uri": "hf://org/dit"}},
        {"name": "vae", "kind": "vae", "source": {"uri": "hf://org/vae"}},
    ]
    spec["loops"] = [
        {"name": "denoise", "kind": "diffusion", "components": ["dit", "vae"], "steps": 50}
    ]
    spec["recipe"] = {
        "method": "distilled",
        "assumesLoop": "denoise",
        "assumesPrecision": "bf16",
        "steps": 4,
    }


CASES: list[tuple[str, Edit, str, str]] = [
    (
        "unknown loop in recipe",
        lambda s: s["recipe"].update(assumesLoop="chat"),
        "spec.recipe.assumesLoop",
        "unknown_loop",
    ),
    (
        "loop lists an undeclared component",
        lambda s: s["loops"][0]["components"].append("draft"),
        "spec.loops[0].components[1]",
        "unknown_component",
    ),
    (
        "requiredFor names an undeclared loop",
        lambda s: s["components"][0]["requiredFor"].append("chat"),
        "spec.components[0].requiredFor[1]",
        "unknown_loop",
    ),
    (
        "optionalFor names an undeclared loop",
        lambda s: s["components"][0].update(optionalFor=["chat"]),
        "spec.components[0].optionalFor[0]",
        "unknown_loop",
    ),
    (
        "required and optional for the same loop",
        lambda s: s["components"][0].update(optionalFor=["generate"]),
        "spec.components[0].optionalFor[0]",
        "conflict",
    ),
    (
        "required by a loop that does not list it",
        lambda s: s["components"].append(
            {
                "name": "enc",
                "kind": "encoder",
                "source": {"uri": "loom://tiny"},
                "requiredFor": ["generate"],
            }
        ),
        "spec.components[1].requiredFor[0]",
        "not_in_loop",
    ),
    (
        "duplicate component names",
        lambda s: s["components"].append(dict(s["components"][0])),
        "spec.components[1].name",
        "duplicate",
    ),
    (
        "duplicate loop names",
        lambda s: s["loops"].append(dict(s["loops"][0])),
        "spec.loops[1].name",
        "duplicate",
    ),
    (
        "steps on an ar_decode loop",
        lambda s: s["loops"][0].update(steps=4),
        "spec.loops[0].steps",
        "steps_not_allowed",
    ),
    (
        "diffusion loop in a llama model",
        lambda s: s["loops"][0].update(kind="diffusion", cachePolicy=None),
        "spec.loops[0].kind",
        "wrong_loop_kind",
    ),
    (
        "prefix caching outside ar_decode",
        lambda s: s["loops"][0].update(kind="encode"),
        "spec.loops[0].cachePolicy",
        "cache_not_allowed",
    ),
    (
        "recipe steps with an ar_decode loop",
        lambda s: s["recipe"].update(steps=4),
        "spec.recipe.steps",
        "steps_not_allowed",
    ),
    (
        "recipe precision differs from the transformer's",
        lambda s: s["recipe"].update(assumesPrecision="bf16"),
        "spec.recipe.assumesPrecision",
        "precision_mismatch",
    ),
    (
        "a 4-step distilled model served by a 50-step loop",
        _diffusion,
        "spec.recipe.steps",
        "step_mismatch",
    ),
    (
        "llama with mla attention",
        lambda s: s.update(
            architecture={
                "numLayers": 2,
                "hiddenSize": 64,
                "numAttentionHeads": 4,
                "attention": {"kind": "mla", "kvLoraRank": 32, "qkRopeHeadDim": 8},
            }
        ),
        "spec.architecture.attention.kind",
        "wrong_attention",
    ),
    (
        "sparse-mla without an indexer",
        lambda s: s.update(
            family="sparse-mla",
            architecture={
                "numLayers": 2,
                "hiddenSize": 64,
                "numAttentionHeads": 4,
                "attention": {"kind": "mla", "kvLoraRank": 32, "qkRopeHeadDim": 8},
            },
        ),
        "spec.architecture.indexer",
        "missing_indexer",
    ),
]


@pytest.mark.parametrize(
    ("edit", "path", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule_reports_its_path_and_code(
    card_data: dict[str, Any], edit: Edit, path: str, code: str
) -> None:
    edit(card_data["spec"])
    with pytest.raises(CardError) as info:
        parse_card(ModelCard, card_data)
    assert [(e.path, e.code) for e in info.value.errors] == [(path, code)]


def test_step_mismatch_message_names_both_step_counts(card_data: dict[str, Any]) -> None:
    _diffusion(card_data["spec"])
    with pytest.raises(CardError) as info:
        parse_card(ModelCard, card_data)
    assert "needs 4 steps" in str(info.value) and "runs 50" in str(info.value)


def test_distilled_model_with_matching_steps_is_valid(card_data: dict[str, Any]) -> None:
    _diffusion(card_data["spec"])
    card_data["spec"]["loops"][0]["steps"] = 4
    card = parse_card(ModelCard, card_data)
    assert card.loop("denoise").steps == card.spec.recipe.steps == 4
