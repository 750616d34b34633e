"""The local router's upkeep: a card with workflows finds each other card's router in the state
directory of the `loom up` beside it, and the router config carries those URLs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loom_operator.local.cards import parse_fleet_cards
from loom_operator.local.launch import router_config
from loom_operator.local.router_keeper import stage_urls
from loom_operator.local.state import (
    ProcessTable,
    RouterEntry,
    StateError,
    StatePaths,
    save_processes,
)
from loom_router.shell.config import file_config_from_dict

ROOT = Path(__file__).resolve().parents[3]


def test_a_workflows_stages_find_the_fleets_beside_this_one(tmp_path: Path) -> None:
    """`loom up` of a card with workflows reads each other card's router from its state
    directory (a sibling of this fleet's); a card no `loom up` runs here is a clear error."""
    cards = parse_fleet_cards(ROOT / "examples" / "tiny-storyboard.yaml")
    paths = StatePaths(tmp_path / "tiny-storyboard")
    with pytest.raises(StateError, match="DeploymentCard tiny-mot, which no `loom up` runs here"):
        stage_urls(cards, paths, {})
    router = RouterEntry(pid=1, ident=None, started_at=0.0, port=8101, admin_port=8102)
    save_processes(StatePaths(tmp_path / "tiny-mot"), ProcessTable(router=router))
    urls = stage_urls(cards, paths, {})
    assert urls == {"tiny-mot": "http://127.0.0.1:8101"}
    assert stage_urls(cards, paths, {"tiny-mot": "http://kept"}) == {"tiny-mot": "http://kept"}
    doc = json.loads(router_config(cards, tmp_path / "tok", urls))
    assert [s.url for s in file_config_from_dict(doc).workflows[0].stages] == [
        "http://127.0.0.1:8101", None
    ]  # fmt: skip
