"""The cards a local fleet serves: one file with a ModelCard and the DeploymentCard that uses it,
checked for what one machine can run, converted once into the fleet controller's DesiredFleet.

Owns reading and checking the card file and noticing that it changed; never starts anything.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import load_documents
from loom_operator.fleet.desired import DesiredFleet, FleetError, desired_fleet, served_component
from loom_runtime.card import CardError, FieldError, ModelCard, Source

LOCAL_SCHEMES = ("file", "loom")


class LocalCardError(ValueError):
    """The card file cannot be served locally; the message says every reason and where."""


@dataclass(frozen=True)
class FleetCards:
    """The parsed cards of one file and the fleet they ask for."""

    model: ModelCard
    deployment: DeploymentCard
    desired: DesiredFleet
    """With `source_uri` made absolute, so workers and LoadWeights need no card directory."""
    text: str
    sha256: str

    @property
    def name(self) -> str:
        return self.deployment.name


def absolute_source(uri: str, origin: Path) -> str:
    """`uri` with a relative `file:` path resolved against the card file at `origin`."""
    source = Source(uri=uri)
    path = source.local_path(origin)
    return uri if path is None else f"file://{path.resolve()}"


def _problems(model: ModelCard, deployment: DeploymentCard) -> list[str]:
    problems = []
    if deployment.spec.backend != "native":
        problems.append(
            f"spec.backend: {deployment.spec.backend!r} runs on Kubernetes only; "
            "`loom up` runs the native runtime (backend: native)"
        )
    source = served_component(model).source
    if source.scheme not in LOCAL_SCHEMES:
        problems.append(
            f"source.uri {source.uri!r}: `loom up` loads local checkpoints only (file:… or "
            f"loom://tiny); download {source.scheme}:// weights and point at the directory"
        )
    return problems


def parse_fleet_cards(path: Path, origin: Path | None = None) -> FleetCards:
    """The cards in `path`; LocalCardError listing every problem. `origin`: the file relative
    sources resolve against (default `path` itself)."""
    try:
        cards = load_documents(path)
    except CardError as exc:
        raise LocalCardError("\n".join(str(e) for e in exc.errors)) from None
    if len(cards.deployment_cards) != 1:
        raise LocalCardError(
            f"{path}: `loom up` serves one DeploymentCard per file, found "
            f"{len(cards.deployment_cards)}"
        )
    deployment = cards.deployment_cards[0]
    model = cards.model_card(deployment.spec.model_card, deployment.metadata.namespace)
    if model is None:
        raise LocalCardError(
            f"{path}: DeploymentCard {deployment.name} serves ModelCard "
            f"{deployment.spec.model_card!r}: put that ModelCard in the same file"
        )
    problems = _problems(model, deployment)
    if problems:
        raise LocalCardError("\n".join(f"{path}: {p}" for p in problems))
    try:
        desired = desired_fleet(model, deployment)
    except FleetError as exc:
        raise LocalCardError(f"{path}: {exc}") from None
    try:
        source = absolute_source(desired.source_uri, origin or path)
    except CardError as exc:
        raise LocalCardError("\n".join(_format(e) for e in exc.errors)) from None
    text = path.read_text(encoding="utf-8")
    return FleetCards(
        model=model,
        deployment=deployment,
        desired=dataclasses.replace(desired, source_uri=source),
        text=text,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
    )


def _format(e: FieldError) -> str:
    return str(e)


class CardWatcher:
    """Tells when a file's content changed since it was last read (mtime first, then a hash)."""

    def __init__(self, path: Path, sha256: str | None = None) -> None:
        self.path = path
        self._mtime: float | None = self._stat()
        self._sha = sha256

    def _stat(self) -> float | None:
        try:
            return self.path.stat().st_mtime_ns / 1e9
        except OSError:
            return None

    def changed(self) -> bool:
        """True once per edit that changed the file's bytes (a touch without edits is not one)."""
        mtime = self._stat()
        if mtime is None or mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            sha = hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return False
        if sha == self._sha:
            return False
        self._sha = sha
        return True

    def seen(self, sha256: str) -> None:
        """Record `sha256` as the content already acted on (written by this controller)."""
        self._sha = sha256
        self._mtime = self._stat()
