"""A DeploymentCard's workflows as ROUTER.json carries them: each stage's card and router URL
(None: the card's own router), and the other cards the stages run on, each once."""

from __future__ import annotations

from pathlib import Path

from loom_operator.api.documents import load_documents
from loom_operator.fleet.workflows import stage_cards, workflows_document

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny-storyboard.yaml"


def test_the_router_gets_each_stages_card_and_url() -> None:
    (card,) = load_documents(EXAMPLE).deployment_cards
    assert stage_cards(card) == ("tiny-mot",)
    doc = workflows_document(card, {"tiny-mot": "http://127.0.0.1:8001"})
    assert [w["name"] for w in doc] == ["think-draw-animate", "think-then-paint"]
    assert doc[0]["stages"] == [
        {"name": "think", "card": "tiny-mot", "route": "images", "url": "http://127.0.0.1:8001"},
        {"name": "animate", "card": "tiny-storyboard", "route": "videos", "url": None},
    ]
