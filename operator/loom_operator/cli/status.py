"""`loom status [CARD.yaml | --state-dir DIR]`: the local fleet as its controller last saw it —
workers (role, address, version, state, in-flight, restarts) and the conditions.

Reads the state directory and prints; never talks to a worker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loom_operator.local.cards import LocalCardError, parse_fleet_cards
from loom_operator.local.snapshot import FleetStatus, load_status
from loom_operator.local.state import StateError, StatePaths, controller_running, find_state


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="show a local fleet: workers, versions, conditions")
    add_target(p)
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.set_defaults(run=run)


def add_target(p: argparse.ArgumentParser) -> None:
    """CARD.yaml or --state-dir: which local fleet (the only one under .loom/ by default)."""
    p.add_argument("card", type=Path, nargs="?", metavar="CARD.yaml", help="the fleet's card")
    p.add_argument("--state-dir", type=Path, help="the fleet's state directory")


def target(args: argparse.Namespace) -> StatePaths:
    """The state directory `args` name; StateError or LocalCardError if none can be found."""
    deployment = None
    if args.card is not None and args.state_dir is None:
        deployment = parse_fleet_cards(args.card).name
    return find_state(deployment, args.state_dir)


def run(args: argparse.Namespace) -> int:
    # Piped (not a terminal), the table keeps its columns readable instead of 80 wide.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    try:
        paths = target(args)
        status = load_status(paths)
    except (StateError, LocalCardError, OSError) as exc:
        console.print(f"[bold red]loom status:[/] {exc}")
        return 1
    if status is None:
        console.print(f"[bold red]loom status:[/] no fleet has run in {paths.root}")
        return 1
    running = controller_running(paths)
    if args.json:
        doc = json.loads(status.to_json())
        doc["controller_running"] = running
        print(json.dumps(doc, indent=1))
        return 0
    render(console, status, running)
    return 0


def render(console: Console, status: FleetStatus, running: bool) -> None:
    age = time.time() - status.updated_at
    if status.stopped:
        state = "[dim]stopped[/]"
    elif running:
        state = f"[green]running[/] (controller pid {status.controller_pid})"
    else:
        state = "[red]controller not running[/] — workers may still run: `loom down` stops them"
    console.print(
        f"[bold]{status.deployment}[/]  {state}  endpoint {status.endpoint}  "
        f"target {status.target_version} ({status.strategy})  [dim]as of {age:.0f}s ago[/]"
    )
    sync = status.weight_sync
    if sync is not None and sync.active:
        console.print(f"weight sync to {sync.target_version}: {sync.phase} — {sync.message}")
    table = Table("worker", "role", "address", "version", "state", "ready", "routed",
                  "in-flight", "restarts", "KV free")  # fmt: skip
    for w in status.workers:
        table.add_row(
            w.name, w.role, w.address, w.version or "-", w.state, _yes(w.ready), _yes(w.routed),
            str(w.in_flight), str(w.restarts), f"{w.kv_free_blocks}/{w.kv_blocks}",
        )  # fmt: skip
    console.print(table)
    if status.scaling:
        scaling = Table("role", "planned", "serving", "reason", "why")
        for r in status.scaling:
            scaling.add_row(r.role, str(r.replicas), str(r.ready), r.reason, r.message)
        console.print(scaling)
    conditions = Table("condition", "status", "reason", "message")
    for c in status.conditions:
        conditions.add_row(c.type, c.status, c.reason, c.message)
    console.print(conditions)


def _yes(value: bool) -> str:
    return "yes" if value else "no"
