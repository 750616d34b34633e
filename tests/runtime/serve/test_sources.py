"""Checkpoint sources a worker can load by itself, and a clear refusal for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_runtime.errors import CheckpointError
from loom_runtime.serve.sources import checkpoint_path


def test_paths_and_file_uris_resolve(tmp_path: Path) -> None:
    card = tmp_path / "cards" / "c.yaml"
    assert checkpoint_path("/abs/ckpt") == Path("/abs/ckpt")
    assert checkpoint_path("file:///abs/ckpt") == Path("/abs/ckpt")
    assert checkpoint_path("file:rel/ckpt", card) == (tmp_path / "cards/rel/ckpt").resolve()
    assert checkpoint_path("rel/ckpt", card) == (tmp_path / "cards/rel/ckpt").resolve()


def test_loom_tiny_resolves_into_the_loom_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path))
    existing = tmp_path / "models" / "tiny"
    existing.mkdir(parents=True)
    (existing / "config.json").write_text("{}")  # already generated: nothing to do
    assert checkpoint_path("loom://tiny") == existing


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("", "empty"),
        ("s3://bucket/model", "fetch s3://"),
        ("hf://org/name", "fetch hf://"),
        ("loom://huge", "loom://"),
        ("pvc://store/v1", "not mounted at /var/lib/loom/models/store"),  # no claim here
        ("ftp://x/y", "unsupported"),
        ("push://0a1b", "a trainer pushed .* start this worker from a checkpoint"),
    ],
)
def test_other_sources_are_refused_with_what_to_do(uri: str, words: str) -> None:
    with pytest.raises(CheckpointError, match=words):
        checkpoint_path(uri)
