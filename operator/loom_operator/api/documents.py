"""Loading a multi-document YAML file into ModelCards and DeploymentCards, with every error.

Owns routing documents by kind and the checks across documents; never prints or applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loom_operator.api.compatibility import compatibility_problems
from loom_operator.api.deployment_card import DeploymentCard
from loom_runtime.card.base import API_GROUP
from loom_runtime.card.errors import CardError, FieldError, format_path
from loom_runtime.card.load import document_kind, document_source, parse_card, read_documents
from loom_runtime.card.model_card import ModelCard

KINDS = ("ModelCard", "DeploymentCard")


@dataclass(frozen=True)
class CardSet:
    """The cards of one file, in document order; `skipped` lists documents of other kinds."""

    model_cards: tuple[ModelCard, ...] = ()
    deployment_cards: tuple[DeploymentCard, ...] = ()
    skipped: tuple[str, ...] = ()

    def model_card(self, name: str, namespace: str | None = None) -> ModelCard | None:
        """The ModelCard called `name` in `namespace`, or None."""
        for card in self.model_cards:
            if card.name == name and card.metadata.namespace == namespace:
                return card
        return None


def _foreign(doc: object) -> str | None:
    """`Kind/name` of a document that is not Loom's to check, or None if it is."""
    kind = document_kind(doc)
    api = doc.get("apiVersion") if isinstance(doc, dict) else None
    if kind is None or kind in KINDS or (isinstance(api, str) and api.startswith(API_GROUP)):
        return None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{kind}/{name}"


def _parse_one(doc: object, source: str) -> ModelCard | DeploymentCard:
    kind = document_kind(doc)
    if kind == "ModelCard":
        return parse_card(ModelCard, doc, source)
    if kind == "DeploymentCard":
        return parse_card(DeploymentCard, doc, source)
    if not isinstance(doc, dict):
        msg = "a document must be a mapping with apiVersion, kind, metadata and spec"
    elif kind is None:
        msg = f"missing kind: {' or '.join(KINDS)}"
    else:
        msg = f"unknown kind {kind!r} in {API_GROUP}: use {' or '.join(KINDS)}"
    raise CardError([FieldError("kind" if isinstance(doc, dict) else "", msg, "kind", source)])


def _cross_errors(cards: Sequence[tuple[str, ModelCard | DeploymentCard]]) -> list[FieldError]:
    """Duplicate names, and each DeploymentCard against the ModelCard it names."""
    errors: list[FieldError] = []
    seen: set[tuple[str, str | None, str]] = set()
    for source, card in cards:
        key = (card.kind, card.metadata.namespace, card.name)
        if key in seen:
            msg = f"another {card.kind} in this file is named {card.name!r}"
            errors.append(FieldError("metadata.name", msg, "duplicate", source))
        seen.add(key)
    models = {(c.metadata.namespace, c.name): c for _, c in cards if isinstance(c, ModelCard)}
    for source, card in cards:
        if not isinstance(card, DeploymentCard):
            continue
        model = models.get((card.metadata.namespace, card.spec.model_card))
        if model is not None:
            for path, code, msg in compatibility_problems(card, model):
                errors.append(FieldError(format_path(path), msg, code, source))
        elif models:
            names = ", ".join(sorted(name for _, name in models))
            msg = f"no ModelCard named {card.spec.model_card!r} in this file (it has: {names})"
            errors.append(FieldError("spec.modelCard", msg, "unknown_model_card", source))
    return errors


def parse_documents(docs: Sequence[tuple[int, object]], file: str) -> CardSet:
    """Cards from parsed YAML documents `(index, data)`; CardError with every problem found.

    Errors carry `file:index` as their source. A DeploymentCard's modelCard must name a
    ModelCard of the same set when the set has any (else the ModelCard is applied apart).
    """
    errors: list[FieldError] = []
    cards: list[tuple[str, ModelCard | DeploymentCard]] = []
    skipped: list[str] = []
    for index, doc in docs:
        source = document_source(file, index)
        foreign = _foreign(doc)
        if foreign is not None:
            skipped.append(foreign)
            continue
        try:
            cards.append((source, _parse_one(doc, source)))
        except CardError as exc:
            errors.extend(exc.errors)
    errors.extend(_cross_errors(cards))
    if errors:
        raise CardError(errors)
    return CardSet(
        model_cards=tuple(c for _, c in cards if isinstance(c, ModelCard)),
        deployment_cards=tuple(c for _, c in cards if isinstance(c, DeploymentCard)),
        skipped=tuple(skipped),
    )


def load_documents(path: str | Path) -> CardSet:
    """The cards of a multi-document YAML file; CardError listing every error as
    `file:document: path: message`."""
    return parse_documents(read_documents(path), str(path))
