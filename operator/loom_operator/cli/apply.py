"""`loom apply CARD.yaml`: check a card and hand it to the local fleet's controller, which
reconciles to it (replicas up or down; a new weightsVersion starts a weight sync).

Validates and installs the card file in the state directory; the controller does the rest.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from loom_operator.local.cards import LocalCardError, parse_fleet_cards
from loom_operator.local.state import (
    DEFAULT_ROOT,
    Applied,
    StateError,
    StatePaths,
    controller_running,
    save_applied,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "apply", help="check a card and give it to the running local fleet (loom up)"
    )
    p.add_argument("card", type=Path, metavar="CARD.yaml")
    p.add_argument("--state-dir", type=Path, help=f"default {DEFAULT_ROOT}/<deployment>")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    try:
        cards = parse_fleet_cards(args.card)
    except (LocalCardError, OSError) as exc:
        console.print(f"[bold red]loom apply:[/] {exc}")
        return 2
    paths = StatePaths(args.state_dir) if args.state_dir else StatePaths.for_deployment(cards.name)
    text = args.card.read_text(encoding="utf-8")
    applied = Applied(
        str(args.card.resolve()), hashlib.sha256(text.encode()).hexdigest(), time.time()
    )
    try:
        save_applied(paths, text, applied)
    except (StateError, OSError) as exc:
        console.print(f"[bold red]loom apply:[/] {exc}")
        return 1
    d = cards.desired
    roles = ", ".join(f"{t.role} ×{t.replicas}" for t in d.roles)
    console.print(f"applied {cards.name}: {roles} on {d.component} {d.weights_version}")
    if controller_running(paths):
        console.print(f"the controller reconciles now; `loom status --state-dir {paths.root}`")
    else:
        console.print(f"no controller runs {paths.root}: `loom up {args.card}` starts the fleet")
    return 0
