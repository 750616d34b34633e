"""`loom validate FILE...`: check cards and print every error as `file:doc: path: message`.

Reads files and prints; the checks live in loom_operator.api and loom_runtime.card.
"""

from __future__ import annotations

import argparse
from typing import Any

from loom_operator.api.documents import CardSet, load_documents
from loom_runtime.card.errors import CardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="check ModelCards and DeploymentCards; print every error with its field path",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="YAML files (several documents each)")
    p.set_defaults(run=run)


def summary(cards: CardSet) -> str:
    """`ModelCard tiny, DeploymentCard tiny-pd` (and what was skipped)."""
    parts = [f"ModelCard {c.name}" for c in cards.model_cards]
    parts += [f"DeploymentCard {c.name}" for c in cards.deployment_cards]
    parts += [f"skipped {s}" for s in cards.skipped]
    return ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    failed = 0
    for file in args.files:
        try:
            cards = load_documents(file)
        except CardError as exc:
            failed += 1
            for err in exc.errors:
                print(err)
            continue
        if not cards.model_cards and not cards.deployment_cards:
            failed += 1
            print(f"{file}: no ModelCard or DeploymentCard in the file")
            continue
        print(f"OK {file} ({summary(cards)})")
    if failed and len(args.files) > 1:
        print(f"{failed} of {len(args.files)} files have errors")
    return 1 if failed else 0
