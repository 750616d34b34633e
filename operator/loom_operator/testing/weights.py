"""Two checkpoints that weight-sync tests alternate between, and their greedy references.

Owns the version → checkpoint rule (v1, v3, … the first; v2, v4, … the second) and computing the
references with a plain single worker per checkpoint; never makes a checkpoint (the caller
passes directories `loom_runtime.models.tiny.init_tiny` wrote).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import reference_worker
from loom_operator.testing.load import reference_streams


@dataclass(frozen=True)
class Weights:
    """The two checkpoints versions alternate between, and their greedy references."""

    paths: tuple[Path, Path]
    references: tuple[list[tuple[str, ...]], list[tuple[str, ...]]]

    def for_version(self, version: str) -> int:
        """v1, v3, … load checkpoint 0; v2, v4, … checkpoint 1."""
        return (int(version.removeprefix("v")) - 1) % 2

    def source(self, version: str) -> str:
        return f"file://{self.paths[self.for_version(version)]}"

    def expected(self, *versions: str) -> dict[str, list[tuple[str, ...]]]:
        return {v: self.references[self.for_version(v)] for v in versions}


def two_versions(
    paths: tuple[Path, Path],
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    root: Path,
    env: Mapping[str, str],
) -> Weights:
    """`paths` with each one's greedy streams of `prompts` from a plain fp64 worker (its card and
    log under `root`); the two must answer differently, or a sync could not be told apart."""
    refs = []
    for i, path in enumerate(paths):
        card = root / f"ref-{i}.yaml"
        card.write_text(card_text(f"file://{path}", model=model))
        with reference_worker(card, "float64", root / f"ref-{i}.log", env) as url:
            refs.append(reference_streams(url + "/v1", model, prompts, max_tokens))
    if refs[0] == refs[1]:
        raise AssertionError("the two checkpoints must answer differently")
    return Weights(paths, (refs[0], refs[1]))
