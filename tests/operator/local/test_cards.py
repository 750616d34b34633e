"""Cards for `loom up`: what one machine cannot run is refused with every reason, relative
sources resolve against the card file, and only real edits count as changes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from loom_operator.local.cards import CardWatcher, LocalCardError, parse_fleet_cards
from loom_operator.testing.cards import card_text


def test_a_card_for_kubernetes_only_is_refused_with_every_reason(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    text = card_text("hf://org/model").replace(
        "modelCard: tiny", "modelCard: tiny\n  backend: vllm"
    )
    path.write_text(text)
    with pytest.raises(LocalCardError) as err:
        parse_fleet_cards(path)
    assert "backend" in str(err.value) and "hf://" in str(err.value)


def test_the_deployment_needs_its_model_card_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(card_text("loom://tiny").split("---\n")[1])
    with pytest.raises(LocalCardError, match="put that ModelCard in the same file"):
        parse_fleet_cards(path)


def test_schema_errors_carry_their_field_path(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(card_text("loom://tiny").replace("replicas: 1", "replicas: -1"))
    with pytest.raises(LocalCardError, match="replicas"):
        parse_fleet_cards(path)


def test_relative_sources_resolve_against_the_origin(tmp_path: Path) -> None:
    path = tmp_path / "copy.yaml"
    path.write_text(card_text("file:models/v1"))
    origin = tmp_path / "project" / "card.yaml"
    cards = parse_fleet_cards(path, origin=origin)
    assert cards.desired.source_uri == f"file://{(tmp_path / 'project/models/v1').resolve()}"
    assert cards.name == "tiny-local" and cards.desired.weights_version == "v1"


def test_watcher_sees_edits_but_not_touches(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a")
    watcher = CardWatcher(path, sha256=hashlib.sha256(b"a").hexdigest())
    st = path.stat()
    assert not watcher.changed()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, same bytes
    assert not watcher.changed()
    path.write_text("b")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    assert watcher.changed()
    assert not watcher.changed()  # once per edit
