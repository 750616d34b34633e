"""Reading cards from YAML files: multi-document reading, parsing with errors, the ModelCard loader.

Owns file and YAML I/O for cards; never validates more than the models do, never prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from loom_runtime.card.errors import CardError, FieldError, field_errors, with_source
from loom_runtime.card.model_card import ModelCard

M = TypeVar("M", bound=BaseModel)


def document_source(path: str | Path, index: int) -> str:
    """How errors name a document: `file:N`, N counting documents from 1."""
    return f"{path}:{index}"


def read_documents(path: str | Path) -> list[tuple[int, object]]:
    """The non-empty YAML documents of a file as `(index from 1, data)`; CardError if unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        docs = list(yaml.safe_load_all(text))
    except OSError as exc:
        raise CardError([FieldError("", f"cannot read the file: {exc}", "io", str(path))]) from None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise CardError([FieldError("", f"not valid YAML: {detail}", "yaml", str(path))]) from None
    return [(i, doc) for i, doc in enumerate(docs, start=1) if doc is not None]


def document_kind(doc: object) -> str | None:
    """The `kind` of a document, or None when it is not a mapping with a string kind."""
    if isinstance(doc, dict):
        kind = doc.get("kind")
        return kind if isinstance(kind, str) else None
    return None


def parse_card(model: type[M], data: object, source: str = "") -> M:
    """Build a card model from parsed YAML; CardError with every problem (path and message)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise CardError(with_source(field_errors(exc), source)) from None


def load_model_card(path: str | Path, name: str | None = None) -> ModelCard:
    """The ModelCard in a (multi-document) YAML file; documents of other kinds are skipped.

    With several ModelCards in the file, `name` picks one. Raises CardError listing every
    problem of that card, or saying that there is no (single) such card.
    """
    found: list[tuple[int, object]] = []
    for index, doc in read_documents(path):
        if document_kind(doc) != "ModelCard":
            continue
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        if name is None or (isinstance(meta, dict) and meta.get("name") == name):
            found.append((index, doc))
    if len(found) != 1:
        named = f" named {name!r}" if name else ""
        if not found:
            msg = f"no ModelCard{named} in the file"
        else:
            msg = f"{len(found)} ModelCards{named} in the file: " + (
                "names must be unique" if name else "say which one to load by name"
            )
        raise CardError([FieldError("", msg, "model_card_count", str(path))])
    index, doc = found[0]
    return parse_card(ModelCard, doc, document_source(path, index))
